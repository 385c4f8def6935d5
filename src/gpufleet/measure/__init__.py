"""`gpufleet bench`: measure a cluster's collectives and a script's scaling, and keep the numbers
as a calibration file the planner reads (gpufleet.plan.calibration)."""
