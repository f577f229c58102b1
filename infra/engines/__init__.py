"""Training frameworks (engines): placeholder until the registry lands."""
