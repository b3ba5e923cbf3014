"""The functional core of Shampoo: options, block plans, state and the phases of a
step, on any array-API library."""
