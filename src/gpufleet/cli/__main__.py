"""`python -m gpufleet.cli`: what the `gpufleet` script runs (the tests call it this way)."""

from gpufleet.cli import main

main()
