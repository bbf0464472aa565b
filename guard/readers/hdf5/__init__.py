"""HDF5 and Keras: h5py runs in a worker process; .keras archives."""
