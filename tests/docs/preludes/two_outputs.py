# after: session
# A regression target and a binary one from ten features: `train_df` (160 rows), `val_df` and `test_df` (40
# each), with `features` (10 doubles), `y` (a value) and `y_high` (0.0 or 1.0: y above its median).
_rng = np.random.default_rng(0)
_x = _rng.normal(size=(240, 10))
_y = _x[:, :3].sum(axis=1)
_rows = [(_x[i].tolist(), float(_y[i]), float(_y[i] > np.median(_y))) for i in range(240)]
_schema = "features array<double>, y double, y_high double"
train_df = spark.createDataFrame(_rows[:160], _schema)
val_df = spark.createDataFrame(_rows[160:200], _schema)
test_df = spark.createDataFrame(_rows[200:], _schema)
keras.utils.set_random_seed(0)
