"""The only code that talks to the outside world: one module per system, local and Azure behind one interface."""
