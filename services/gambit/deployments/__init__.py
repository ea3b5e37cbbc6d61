"""Ray Serve deployments: Target, Scorer, Coordinator — thin shells over ``gambit.serving``."""
