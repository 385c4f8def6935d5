"""The inventory of nodes and devices, and the pure allocator that carves clusters out of it."""
