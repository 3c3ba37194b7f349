"""A request's run, planned on the host before anything runs: `run_plan.plan_run` builds the frozen `RunPlan` from its
parts here (the sampler's rows, the picture's, the refiner's, the hires fix's, the speed levers', the ControlNet units',
the prompt's tokens and emphasis). Host data only: no JAX arrays, nothing compiled."""
