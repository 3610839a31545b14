"""What a run leaves: per-request records (schema.py), their files (records_file.py),
the result a run reports (results.py) and prints (summary_table.py), who paid (the request
classes: request_classes.py), and `ascendra records`'s report of a records file
(records_report.py, records_cmd.py)."""
