"""Mapping the names: each source tensor's PT <-> Flax target name and axis order, or a decision."""
