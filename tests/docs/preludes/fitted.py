# after: two_classes
# `fitted`: a KerasModel fitted on `train_df` (2 epochs).
fitted = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                        metrics=["accuracy"], epochs=2, verbose=0).fit(train_df)
