"""Nsight Systems exports: the SQLite file or the parquetdir folder `nsys export` writes, read into the
format-neutral event store (trace/events.py) and TraceTables (trace/tables.py).

nsys_export   the export in either format: checks, SQL over its tables, its table and column names
sqlite_pages  the decoder of an SQLite file's pages (integer columns, NVTX text)
gpu_samples   GPU metric samples, left in the export and read from it when asked for
store         the copy of the tables that grow with a capture into the event store
nsys_sqlite   the loader: an export into TraceTables
"""
