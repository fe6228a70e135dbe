"""What prepares and runs a server on this machine: the launcher, the model and adapter stores."""
