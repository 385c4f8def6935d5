"""Pure builders of per-node commands and environments for each framework launcher."""
