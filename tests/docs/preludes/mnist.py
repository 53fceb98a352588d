# after: session
# The bundled digits, small: `train_df` (1,000 training digits), `more_df` (500 others), `test_df` (500 test
# digits), each with `pixels` (784 values) and `label`; and a plain Keras model saved as `cnn.keras`.
train_df = spark.read.parquet("data/mnist10k/train.parquet").limit(1000)
more_df = spark.read.parquet("data/mnist10k/train.parquet").offset(1000).limit(500)
test_df = spark.read.parquet("data/mnist10k/test.parquet").limit(500)
keras.Sequential([keras.Input((784,)), keras.layers.Rescaling(1 / 255), keras.layers.Dense(10, activation="softmax")]).save("cnn.keras")
