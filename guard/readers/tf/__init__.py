"""TensorFlow: tensor bundles (over a LevelDB table) and TFLite."""
