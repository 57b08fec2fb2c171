"""Federated fine-tuning of pock bundles on Flower (pip install 'pock-mlir[federated]').

client.py is the ClientApp (a device: its bundle, its data, the torch-free Trainer), server.py
the ServerApp (FedAvg or FedAdam over the trainable tensors), wire.py what crosses the network,
launch.py the pock-federate command that runs a local federation on Flower's Deployment Engine.
"""
