"""One property checked across the modules: bad input, contracts, gradients, exact arithmetic, edge sizes."""
