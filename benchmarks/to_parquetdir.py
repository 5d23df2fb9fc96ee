"""Write an nsys SQLite export as a parquetdir (one TABLE.parquet per table) through DuckDB, for measuring
the parquetdir route on a generated export where no nsys 2024+ is at hand. A stand-in for `nsys export
--type=parquetdir`: signed integers where nsys writes unsigned ones, and DuckDB's row groups; on the committed
2025.3.1 capture its analysis equals that of nsys's own parquetdir (benchmarks/ENGINE.md).

    python benchmarks/to_parquetdir.py EXPORT.sqlite OUT.parquetdir
"""

import sys
import time
from pathlib import Path

from sftprof.trace.nsys.nsys_export import SqliteExport


def main(source: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    export = SqliteExport(source)
    for table in sorted(export.tables):
        target = str(out / f"{table}.parquet").replace("'", "''")
        export.reader.execute(f"""COPY (SELECT * FROM "{table}") TO '{target}' (FORMAT parquet, COMPRESSION snappy)""")
    export.close()
    print(f"{out}: {len(export.tables)} tables in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
