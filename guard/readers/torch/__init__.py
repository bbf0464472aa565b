"""The PyTorch family: zip and legacy pickles, torch.export, TorchScript and ExecuTorch."""
