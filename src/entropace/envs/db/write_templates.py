"""Write-task templates (INSERT / UPDATE / DELETE) with gold statements, per database and level.

A :class:`WriteTemplate` is data: a task text, the gold statements (run in order, one per
agent action), the tables they change (the only tables the agent may write in that episode)
and parameter pools (as in :mod:`entropace.envs.db.templates`: a SQL query whose rows are the
choices, or a tuple of literal choices; ``"a,b"`` names bind the columns of one row).

Levels:

* ``easy``: one statement on one table, rows named by a key or a simple filter;
* ``medium``: one statement with a subquery or an ``INSERT ... SELECT``, rows chosen through
  another table, arithmetic on values;
* ``hard``: two or three statements over two tables, in an order that matters (children before
  parents, new row before the rows that point at it).

An instance is kept only when every gold statement changes at least one row, the episode's
gold changes at most :data:`entropace.envs.db.questions.MAX_GOLD_CHANGES` rows, and the final
state differs from the original (see :mod:`entropace.envs.db.questions`).

Prices in Chinook are 0.99 and 1.99 only; the percentages offered (5-30 %) never land on a
half cent, so ``ROUND(x * 1.1, 2)`` and ``ROUND(x + x * 0.1, 2)`` agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

WriteKind = Literal["insert", "update", "delete"]


@dataclass(frozen=True)
class WriteTemplate:
    """One write task.

    Attributes:
        name: unique id (``<db>.<difficulty>.<what>``), recorded in the instance.
        question: ``str.format`` task text; parameters are filled in as plain text.
        statements: ``str.format`` gold statements; parameters are filled in as SQL literals.
        tables: the tables the gold statements change (writable in the episode).
        kind: the task's type, as AgentBench labels its samples (the main operation).
        params: name -> pool (see module doc).
    """

    name: str
    question: str
    statements: tuple[str, ...]
    tables: tuple[str, ...]
    kind: WriteKind
    params: dict[str, str | tuple] = field(default_factory=dict)

    @property
    def db(self) -> str:
        return self.name.split(".")[0]

    @property
    def difficulty(self) -> str:
        return self.name.split(".")[1]


_NYC = ("EWR", "JFK", "LGA")
_DAYS = tuple(range(1, 32))
_AGENTS = "SELECT first_name, last_name FROM employees WHERE title = 'Sales Support Agent'"
_UNIQUE_CUSTOMER = (
    "SELECT first_name, last_name FROM customers GROUP BY first_name, last_name HAVING COUNT(*) = 1"
)
_LATEST_INVOICE = (
    "(SELECT invoice_id FROM invoices WHERE customer_id = (SELECT customer_id FROM customers "
    "WHERE first_name = {first} AND last_name = {last}) "
    "ORDER BY invoice_date DESC, invoice_id DESC LIMIT 1)"
)
_ARTIST_TRACKS = (
    "SELECT t.track_id FROM tracks t JOIN albums al ON al.album_id = t.album_id "
    "WHERE al.artist_id = (SELECT artist_id FROM artists WHERE name = {artist})"
)

WRITE_TEMPLATES: tuple[WriteTemplate, ...] = (
    # ----------------------------------------------------------------------- chinook / easy
    WriteTemplate(
        "chinook.easy.insert_genre",
        'Add a new genre named "{name}" to the genres table, with genre_id {new_id}.',
        ("INSERT INTO genres (genre_id, name) VALUES ({new_id}, {name})",),
        ("genres",),
        "insert",
        {
            "name": (
                "Synthwave",
                "K-Pop",
                "Afrobeat",
                "Lo-fi",
                "Shoegaze",
                "Grime",
                "Ambient",
                "Folk",
                "Gospel",
                "Ska",
                "Trip Hop",
                "Bluegrass",
                "Flamenco",
                "Drum and Bass",
                "Tango",
            ),
            "new_id": "SELECT MAX(genre_id) + 1 FROM genres",
        },
    ),
    WriteTemplate(
        "chinook.easy.update_customer_email",
        "Change the email address of the customer {first} {last} to {email}.",
        ("UPDATE customers SET email = {email} WHERE first_name = {first} AND last_name = {last}",),
        ("customers",),
        "update",
        {
            "first,last": _UNIQUE_CUSTOMER,
            "email": ("contact@example.com", "billing@example.org", "new.address@example.net"),
        },
    ),
    WriteTemplate(
        "chinook.easy.update_employee_title",
        'Change the job title of the employee {first} {last} to "{title}".',
        ("UPDATE employees SET title = {title} WHERE first_name = {first} AND last_name = {last}",),
        ("employees",),
        "update",
        {
            "first,last": "SELECT first_name, last_name FROM employees",
            "title": ("Senior Sales Agent", "Regional Manager", "Data Analyst", "Team Lead"),
        },
    ),
    WriteTemplate(
        "chinook.easy.delete_playlist",
        'Delete every playlist named "{playlist}" from the playlists table (leave the '
        "playlist_tracks table as it is).",
        ("DELETE FROM playlists WHERE name = {playlist}",),
        ("playlists",),
        "delete",
        {"playlist": "SELECT DISTINCT name FROM playlists"},
    ),
    # ----------------------------------------------------------------------- flights / easy
    WriteTemplate(
        "flights.easy.insert_airline",
        'Add the airline "{name}" with carrier code "{code}" to the airlines table.',
        ("INSERT INTO airlines (carrier, name) VALUES ({code}, {name})",),
        ("airlines",),
        "insert",
        {
            "code,name": (
                ("NK", "Spirit Airlines"),
                ("G4", "Allegiant Air"),
                ("SY", "Sun Country Airlines"),
                ("MX", "Breeze Airways"),
                ("XP", "Avelo Airlines"),
                ("QX", "Horizon Air"),
                ("G7", "GoJet Airlines"),
                ("PT", "Piedmont Airlines"),
                ("ZW", "Air Wisconsin"),
                ("C5", "CommutAir"),
            )
        },
    ),
    WriteTemplate(
        "flights.easy.insert_plane",
        'Add a plane to the planes table: tail number "{tailnum}", built in {year} by '
        '"{maker}", model "{model}", with {seats} seats. Leave its other columns empty (NULL).',
        (
            "INSERT INTO planes (tailnum, year, manufacturer, model, seats) "
            "VALUES ({tailnum}, {year}, {maker}, {model}, {seats})",
        ),
        ("planes",),
        "insert",
        {
            "tailnum": ("N100EP", "N202EP", "N333EP", "N404EP", "N515EP", "N626EP"),
            "year": (2010, 2012, 2014, 2016),
            "maker,model,seats": (
                ("AIRBUS", "A320-214", 150),
                ("BOEING", "737-824", 160),
                ("EMBRAER", "ERJ 190-100 IGW", 100),
                ("BOMBARDIER INC", "CL-600-2D24", 76),
            ),
        },
    ),
    WriteTemplate(
        "flights.easy.update_plane_seats",
        'Set the number of seats of the plane with tail number "{tailnum}" to {seats}.',
        ("UPDATE planes SET seats = {seats} WHERE tailnum = {tailnum}",),
        ("planes",),
        "update",
        {
            "tailnum": "SELECT tailnum FROM planes WHERE seats IS NOT NULL",
            "seats": (50, 76, 100, 120, 150, 180, 200, 250),
        },
    ),
    WriteTemplate(
        "flights.easy.delete_cancelled",
        "Delete the flights from {origin} on January {day}, 2013 that were cancelled (their "
        "dep_time is NULL).",
        ("DELETE FROM flights WHERE origin = {origin} AND day = {day} AND dep_time IS NULL",),
        ("flights",),
        "delete",
        {"origin": _NYC, "day": _DAYS},
    ),
    # --------------------------------------------------------------------- chinook / medium
    WriteTemplate(
        "chinook.medium.raise_genre_prices",
        'Raise the unit price of every track of the genre "{genre}" by {pct}%, rounded to 2 '
        "decimals.",
        (
            "UPDATE tracks SET unit_price = ROUND(unit_price * {factor}, 2) "
            "WHERE genre_id = (SELECT genre_id FROM genres WHERE name = {genre})",
        ),
        ("tracks",),
        "update",
        {
            "genre": "SELECT name FROM genres",
            "pct,factor": ((5, 1.05), (10, 1.1), (15, 1.15), (20, 1.2), (30, 1.3)),
        },
    ),
    WriteTemplate(
        "chinook.medium.reassign_country",
        "Make the sales support agent {first} {last} the support representative of every "
        "customer from {country}.",
        (
            "UPDATE customers SET support_rep_id = (SELECT employee_id FROM employees "
            "WHERE first_name = {first} AND last_name = {last}) WHERE country = {country}",
        ),
        ("customers",),
        "update",
        {"first,last": _AGENTS, "country": "SELECT DISTINCT country FROM customers"},
    ),
    WriteTemplate(
        "chinook.medium.delete_lines_of_city",
        "Delete all invoice lines of the invoices billed to the city {city}.",
        (
            "DELETE FROM invoice_lines WHERE invoice_id IN "
            "(SELECT invoice_id FROM invoices WHERE billing_city = {city})",
        ),
        ("invoice_lines",),
        "delete",
        {"city": "SELECT DISTINCT billing_city FROM invoices"},
    ),
    WriteTemplate(
        "chinook.medium.album_into_playlist",
        'Add every track of the album "{album}" to the playlist "{playlist}" (playlist_id '
        "{pid}), skipping tracks that are already in that playlist.",
        (
            "INSERT INTO playlist_tracks (playlist_id, track_id) SELECT {pid}, track_id "
            "FROM tracks WHERE album_id = (SELECT album_id FROM albums WHERE title = {album}) "
            "AND track_id NOT IN (SELECT track_id FROM playlist_tracks WHERE playlist_id = {pid})",
        ),
        ("playlist_tracks",),
        "insert",
        {
            "album": "SELECT title FROM albums GROUP BY title HAVING COUNT(*) = 1",
            "pid,playlist": "SELECT playlist_id, name FROM playlists WHERE name IN "
            "(SELECT name FROM playlists GROUP BY name HAVING COUNT(*) = 1)",
        },
    ),
    # --------------------------------------------------------------------- flights / medium
    WriteTemplate(
        "flights.medium.add_delay",
        'All flights of carrier "{carrier}" from {origin} on January {day}, 2013 left and '
        "arrived {m} minutes later than recorded: add {m} to both their dep_delay and "
        "arr_delay (missing values stay missing).",
        (
            "UPDATE flights SET dep_delay = dep_delay + {m}, arr_delay = arr_delay + {m} "
            "WHERE carrier = {carrier} AND origin = {origin} AND day = {day}",
        ),
        ("flights",),
        "update",
        {
            "carrier,origin,day": "SELECT DISTINCT carrier, origin, day FROM flights",
            "m": (5, 10, 15, 30, 45),
        },
    ),
    WriteTemplate(
        "flights.medium.delete_idle_planes",
        'Delete from the planes table every plane made by "{maker}" that flew no flight in '
        "January 2013 (its tail number appears in no row of flights).",
        (
            "DELETE FROM planes WHERE manufacturer = {maker} AND tailnum NOT IN "
            "(SELECT tailnum FROM flights WHERE tailnum IS NOT NULL)",
        ),
        ("planes",),
        "delete",
        {"maker": "SELECT DISTINCT manufacturer FROM planes"},
    ),
    WriteTemplate(
        "flights.medium.broken_visibility",
        "The visibility sensor at {origin} was broken on January {day}, 2013 from hour "
        "{hour} on: set visib to NULL in the weather rows of that airport and day with an "
        "hour of at least {hour}.",
        (
            "UPDATE weather SET visib = NULL WHERE origin = {origin} AND day = {day} "
            "AND hour >= {hour}",
        ),
        ("weather",),
        "update",
        {"origin": _NYC, "day": _DAYS, "hour": (0, 6, 12, 18)},
    ),
    WriteTemplate(
        "flights.medium.missing_planes",
        "Some tail numbers in flights are missing from the planes table. Add to planes every "
        'tail number of a flight of carrier "{carrier}" that is missing there, once each, with '
        "all other columns empty (NULL).",
        (
            "INSERT INTO planes (tailnum) SELECT DISTINCT tailnum FROM flights "
            "WHERE carrier = {carrier} AND tailnum IS NOT NULL "
            "AND tailnum NOT IN (SELECT tailnum FROM planes)",
        ),
        ("planes",),
        "insert",
        {"carrier": "SELECT carrier FROM airlines"},
    ),
    # ----------------------------------------------------------------------- chinook / hard
    WriteTemplate(
        "chinook.hard.playlist_of_artist",
        'Create a new playlist named "{name}" with playlist_id {pid}, and add to it every '
        'track by the artist "{artist}".',
        (
            "INSERT INTO playlists (playlist_id, name) VALUES ({pid}, {name})",
            "INSERT INTO playlist_tracks (playlist_id, track_id) SELECT {pid}, track_id FROM ("
            + _ARTIST_TRACKS
            + ")",
        ),
        ("playlist_tracks", "playlists"),
        "insert",
        {
            "name": ("Road Trip", "Focus", "Workout Mix", "Best Of", "Late Night"),
            "pid": "SELECT MAX(playlist_id) + 1 FROM playlists",
            "artist": "SELECT name FROM artists WHERE artist_id IN (SELECT artist_id FROM "
            "albums) GROUP BY name HAVING COUNT(*) = 1",
        },
    ),
    WriteTemplate(
        "chinook.hard.delete_latest_invoice",
        "Delete the most recent invoice of the customer {first} {last} (latest invoice_date; "
        "among equal dates the largest invoice_id) together with all of its invoice lines.",
        (
            "DELETE FROM invoice_lines WHERE invoice_id = " + _LATEST_INVOICE,
            "DELETE FROM invoices WHERE invoice_id = " + _LATEST_INVOICE,
        ),
        ("invoice_lines", "invoices"),
        "delete",
        {"first,last": _UNIQUE_CUSTOMER},
    ),
    WriteTemplate(
        "chinook.hard.reprice_invoice",
        "Set the unit price of every invoice line of invoice {invoice} to {price}, then set "
        "the total of that invoice to the sum of unit_price * quantity over its lines, rounded "
        "to 2 decimals.",
        (
            "UPDATE invoice_lines SET unit_price = {price} WHERE invoice_id = {invoice}",
            "UPDATE invoices SET total = (SELECT ROUND(SUM(unit_price * quantity), 2) "
            "FROM invoice_lines WHERE invoice_id = {invoice}) WHERE invoice_id = {invoice}",
        ),
        ("invoice_lines", "invoices"),
        "update",
        {
            "invoice": "SELECT invoice_id FROM invoices WHERE invoice_id IN "
            "(SELECT invoice_id FROM invoice_lines)",
            "price": (0.49, 0.79, 1.29, 1.49),
        },
    ),
    WriteTemplate(
        "chinook.hard.retire_agent",
        "The sales support agent {first} {last} is leaving. Make {to_first} {to_last} the "
        "support representative of all of their customers, then delete {first} {last} from "
        "the employees table.",
        (
            "UPDATE customers SET support_rep_id = (SELECT employee_id FROM employees WHERE "
            "first_name = {to_first} AND last_name = {to_last}) WHERE support_rep_id = "
            "(SELECT employee_id FROM employees WHERE first_name = {first} AND last_name = {last})",
            "DELETE FROM employees WHERE first_name = {first} AND last_name = {last}",
        ),
        ("customers", "employees"),
        "delete",
        {
            "first,last,to_first,to_last": "SELECT a.first_name, a.last_name, b.first_name, "
            "b.last_name FROM employees a JOIN employees b ON a.employee_id <> b.employee_id "
            "WHERE a.title = 'Sales Support Agent' AND b.title = 'Sales Support Agent'"
        },
    ),
    # ----------------------------------------------------------------------- flights / hard
    WriteTemplate(
        "flights.hard.retire_old_planes",
        'Retire the planes made by "{maker}" that were built before {year}: first set tailnum '
        "to NULL in all of their flights, then delete those planes from the planes table.",
        (
            "UPDATE flights SET tailnum = NULL WHERE tailnum IN (SELECT tailnum FROM planes "
            "WHERE manufacturer = {maker} AND year < {year})",
            "DELETE FROM planes WHERE manufacturer = {maker} AND year < {year}",
        ),
        ("flights", "planes"),
        "delete",
        {
            "maker": "SELECT DISTINCT manufacturer FROM planes",
            "year": (1990, 1995, 2000, 2003),
        },
    ),
    WriteTemplate(
        "flights.hard.recode_airline",
        'The airline "{old_name}" (carrier code {old}) changes its code to "{new}": add an '
        'airline with carrier code "{new}" and the same name, move all flights of carrier '
        "{old} to {new}, then delete the airline with code {old}.",
        (
            "INSERT INTO airlines (carrier, name) VALUES ({new}, {old_name})",
            "UPDATE flights SET carrier = {new} WHERE carrier = {old}",
            "DELETE FROM airlines WHERE carrier = {old}",
        ),
        ("airlines", "flights"),
        "update",
        {
            "old,old_name": "SELECT carrier, name FROM airlines",
            "new": ("ZA", "ZB", "ZC", "ZD", "ZE"),
        },
    ),
    WriteTemplate(
        "flights.hard.cancel_evening",
        'All flights of the airline "{airline}" (full name) from {origin} on January {day}, '
        "2013 scheduled at hour {hour} or later (the hour column) were cancelled: set their "
        "dep_time, dep_delay, arr_time, arr_delay and air_time to NULL.",
        (
            "UPDATE flights SET dep_time = NULL, dep_delay = NULL, arr_time = NULL, "
            "arr_delay = NULL, air_time = NULL WHERE carrier = (SELECT carrier FROM airlines "
            "WHERE name = {airline}) AND origin = {origin} AND day = {day} AND hour >= {hour}",
        ),
        ("flights",),
        "update",
        {
            "airline,origin,day": "SELECT DISTINCT a.name, f.origin, f.day FROM flights f "
            "JOIN airlines a ON a.carrier = f.carrier",
            "hour": (12, 15, 18, 20),
        },
    ),
    WriteTemplate(
        "flights.hard.new_airport",
        'A new airport opened: add it to airports with FAA code "{faa}", name "{name}", '
        'latitude {lat}, longitude {lon}, altitude {alt} feet, tz -5, dst "A" and tzone '
        '"America/New_York". Then re-route to it all flights of carrier "{carrier}" from '
        '{origin} to "{dest}" on January {day}, 2013 (their dest becomes "{faa}").',
        (
            "INSERT INTO airports (faa, name, lat, lon, alt, tz, dst, tzone) VALUES ({faa}, "
            "{name}, {lat}, {lon}, {alt}, -5, 'A', 'America/New_York')",
            "UPDATE flights SET dest = {faa} WHERE carrier = {carrier} AND origin = {origin} "
            "AND dest = {dest} AND day = {day}",
        ),
        ("airports", "flights"),
        "insert",
        {
            "faa,name,lat,lon,alt": (
                ("ZNY", "Hudson Valley Regional", 41.6264, -73.8842, 165),
                ("QJN", "Pine Barrens Field", 39.8, -74.55, 98),
                ("XLI", "East End Airport", 40.95, -72.25, 55),
                ("ZLH", "Litchfield Hills Airfield", 41.75, -73.2, 1100),
            ),
            "carrier,origin,dest,day": "SELECT DISTINCT carrier, origin, dest, day FROM flights",
        },
    ),
)


def write_templates_for(db: str, difficulty: str, kind: str) -> tuple[WriteTemplate, ...]:
    """The write templates of database ``db`` at ``difficulty`` of type ``kind``."""
    return tuple(
        t for t in WRITE_TEMPLATES if t.db == db and t.difficulty == difficulty and t.kind == kind
    )
