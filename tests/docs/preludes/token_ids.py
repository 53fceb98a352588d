# after: session
# Token ids of varying length: `df` (160 rows) and `test_df` (40), with `token_ids` (array<int>, ids 1-999,
# 3 to 20 per row) and `label` (long: whether the row has more than 10 ids).
_rng = np.random.default_rng(0)
_rows = []
for _ in range(200):
    _ids = _rng.integers(1, 1000, size=int(_rng.integers(3, 21))).tolist()
    _rows.append((_ids, int(len(_ids) > 10)))
df = spark.createDataFrame(_rows[:160], "token_ids array<int>, label long")
test_df = spark.createDataFrame(_rows[160:], "token_ids array<int>, label long")
