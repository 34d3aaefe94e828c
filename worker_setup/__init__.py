"""Set up a machine's Docker engine to advertise its GPUs to Swarm as slices."""
