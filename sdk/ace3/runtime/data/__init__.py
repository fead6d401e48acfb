"""The job's datasets: reading dataset files, resolving datasets, the distributed loaders."""
