"""The node labeler: NVML (or an inventory file) -> card labels, annotations and capacity on the Node."""
