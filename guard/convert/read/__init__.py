"""Reading the source: a model directory's weight set as ``SourceTensor`` records with their loaders."""
