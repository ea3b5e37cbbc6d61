"""Training scripts for the models the project ships."""
