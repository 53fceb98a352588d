"""The only package that imports Keras and TensorFlow: model specs, replicas, batched predict."""
