# after: session
# Two classes from four features: `train_df` (160 rows) and `test_df` (40), with `features` (4 doubles) and
# `label` (0.0 or 1.0); `model`, a small softmax classifier of them.
_rng = np.random.default_rng(0)
_x = _rng.normal(size=(200, 4))
_rows = [(_x[i].tolist(), float(_x[i, 0] + _x[i, 1] > 0)) for i in range(200)]
train_df = spark.createDataFrame(_rows[:160], "features array<double>, label double")
test_df = spark.createDataFrame(_rows[160:], "features array<double>, label double")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2, activation="softmax")])
