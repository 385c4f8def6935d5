"""The dashboard: a FastAPI app over the store (JSON API, Prometheus /metrics, one page)."""
