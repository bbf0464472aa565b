"""The byte machinery the readers share: forward windows, zip directories, protobuf and flatbuffers walkers."""
