"""Whole networks for the Relax integration's tests and `bench resnet50`: Relax definitions
written with TVM's BlockBuilder and, where PyTorch is installed, the same networks in PyTorch
with the same weights."""
