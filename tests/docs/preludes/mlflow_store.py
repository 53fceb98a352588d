# after: two_classes
# A local MLflow file store in the working directory (as docs/how-to/mlflow.md sets one up), and `est`, an
# estimator of `model` for one epoch.
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
os.environ["MLFLOW_TRACKING_URI"] = "file://" + os.path.abspath("mlruns")
est = KerasEstimator(model=model, loss="sparse_categorical_crossentropy", metrics=["accuracy"], epochs=1, verbose=0)
