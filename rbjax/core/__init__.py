"""The bottom layer: result files, content keys, progress, interrupts, executors, the device mesh, precision."""
