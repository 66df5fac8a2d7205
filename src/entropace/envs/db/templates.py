"""Question templates with gold SQL for the ``db`` family, per database and difficulty.

A :class:`Template` is data: a question format string, a gold SQL format string and parameter
pools. Difficulty levels map to template sets:

* ``easy``: one table: filters, counts, min/max, look-ups;
* ``medium``: joins, GROUP BY with aggregates, ordering / top-k;
* ``hard``: nested subqueries (scalar, IN, correlated), HAVING, joins over 3+ tables.

Answer kinds: ``one`` (a single value), ``set`` (all values, any order), ``top`` (the first
``k`` values of an ordering, in order; the gold SQL selects ``(value, sort_key)`` with
``LIMIT {k}`` and instances whose top ``k + 1`` sort keys tie are discarded, so the answer is
unambiguous).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

AnswerKind = Literal["one", "set", "top"]


@dataclass(frozen=True)
class Template:
    """One question template.

    Attributes:
        name: unique id (``<db>.<difficulty>.<what>``), recorded in the instance.
        question: ``str.format`` text; parameters are filled in as plain text.
        sql: ``str.format`` gold SQL; parameters are filled in as SQL literals, ``{k}`` as int.
        params: name -> pool. A pool is a SQL query (its rows are the choices) or a tuple of
            literal choices. ``"a,b"`` names bind the columns of one row of a multi-column pool.
        kind: answer kind (see module doc).
        ks: choices of ``k`` for ``top`` templates.
        decimals: the question asks to round numbers to this many decimals.
    """

    name: str
    question: str
    sql: str
    params: dict[str, str | tuple] = field(default_factory=dict)
    kind: AnswerKind = "one"
    ks: tuple[int, ...] = (1,)
    decimals: int | None = None

    @property
    def db(self) -> str:
        return self.name.split(".")[0]

    @property
    def difficulty(self) -> str:
        return self.name.split(".")[1]


_NYC = ("EWR", "JFK", "LGA")
_DAYS = tuple(range(1, 32))

TEMPLATES: tuple[Template, ...] = (
    # ----------------------------------------------------------------------- chinook / easy
    Template(
        "chinook.easy.customers_in_country",
        "How many customers are from {country}?",
        "SELECT COUNT(*) FROM customers WHERE country = {country}",
        {"country": "SELECT DISTINCT country FROM customers"},
    ),
    Template(
        "chinook.easy.customer_email",
        "What is the email address of the customer {first} {last}?",
        "SELECT email FROM customers WHERE first_name = {first} AND last_name = {last}",
        {"first,last": "SELECT first_name, last_name FROM customers"},
    ),
    Template(
        "chinook.easy.customers_in_city",
        "List the last names of the customers who live in the city {city}.",
        "SELECT last_name FROM customers WHERE city = {city}",
        {"city": "SELECT DISTINCT city FROM customers"},
        kind="set",
    ),
    Template(
        "chinook.easy.long_tracks",
        "How many tracks are longer than {minutes} minutes?",
        "SELECT COUNT(*) FROM tracks WHERE milliseconds > {minutes} * 60000",
        {"minutes": (5, 6, 7, 8, 10, 12, 15, 20, 30, 45, 60)},
    ),
    Template(
        "chinook.easy.invoices_to_country",
        "How many invoices were billed to the country {country}?",
        "SELECT COUNT(*) FROM invoices WHERE billing_country = {country}",
        {"country": "SELECT DISTINCT billing_country FROM invoices"},
    ),
    Template(
        "chinook.easy.max_invoice_city",
        "What is the total of the largest invoice billed to the city {city}?",
        "SELECT MAX(total) FROM invoices WHERE billing_city = {city}",
        {"city": "SELECT DISTINCT billing_city FROM invoices"},
        decimals=2,
    ),
    Template(
        "chinook.easy.employees_with_title",
        "List the last names of the employees whose job title is {title}.",
        "SELECT last_name FROM employees WHERE title = {title}",
        {"title": "SELECT DISTINCT title FROM employees"},
        kind="set",
    ),
    # --------------------------------------------------------------------- chinook / medium
    Template(
        "chinook.medium.tracks_in_genre",
        'How many tracks belong to the genre "{genre}"?',
        "SELECT COUNT(*) FROM tracks t JOIN genres g ON g.genre_id = t.genre_id "
        "WHERE g.name = {genre}",
        {"genre": "SELECT name FROM genres"},
    ),
    Template(
        "chinook.medium.albums_of_artist",
        'List the titles of the albums by the artist "{artist}".',
        "SELECT al.title FROM albums al JOIN artists ar ON ar.artist_id = al.artist_id "
        "WHERE ar.name = {artist}",
        {"artist": "SELECT name FROM artists WHERE artist_id IN (SELECT artist_id FROM albums)"},
        kind="set",
    ),
    Template(
        "chinook.medium.revenue_country",
        "What is the total amount invoiced to customers who live in {country}?",
        "SELECT ROUND(SUM(i.total), 2) FROM invoices i "
        "JOIN customers c ON c.customer_id = i.customer_id WHERE c.country = {country}",
        {"country": "SELECT DISTINCT country FROM customers"},
        decimals=2,
    ),
    Template(
        "chinook.medium.top_genres",
        "Which {k} genres have the most tracks? Give the genre names, the largest first.",
        "SELECT g.name, COUNT(*) AS n_tracks FROM tracks t "
        "JOIN genres g ON g.genre_id = t.genre_id GROUP BY g.genre_id "
        "ORDER BY n_tracks DESC LIMIT {k}",
        kind="top",
        ks=(2, 3, 4, 5),
    ),
    Template(
        "chinook.medium.album_avg_seconds",
        'What is the average length, in seconds, of the tracks on the album "{album}"?',
        "SELECT ROUND(AVG(t.milliseconds) / 1000.0, 2) FROM tracks t "
        "JOIN albums al ON al.album_id = t.album_id WHERE al.title = {album}",
        {"album": "SELECT title FROM albums"},
        decimals=2,
    ),
    Template(
        "chinook.medium.playlist_size",
        'How many tracks are in the playlist "{playlist}"?',
        "SELECT COUNT(*) FROM playlist_tracks pt "
        "JOIN playlists p ON p.playlist_id = pt.playlist_id WHERE p.name = {playlist}",
        {"playlist": "SELECT DISTINCT name FROM playlists"},
    ),
    Template(
        "chinook.medium.top_artists_albums",
        "Which {k} artists have the most albums? Give the artist names, the most first.",
        "SELECT ar.name, COUNT(*) AS n_albums FROM albums al "
        "JOIN artists ar ON ar.artist_id = al.artist_id GROUP BY ar.artist_id "
        "ORDER BY n_albums DESC LIMIT {k}",
        kind="top",
        ks=(1, 2, 3),
    ),
    Template(
        "chinook.medium.media_types_of_genre",
        'List the names of the media types used by tracks of the genre "{genre}".',
        "SELECT DISTINCT m.name FROM tracks t JOIN genres g ON g.genre_id = t.genre_id "
        "JOIN media_types m ON m.media_type_id = t.media_type_id WHERE g.name = {genre}",
        {"genre": "SELECT name FROM genres"},
        kind="set",
    ),
    # ----------------------------------------------------------------------- chinook / hard
    Template(
        "chinook.hard.top_spenders_country",
        "Which {k} customers from {country} spent the most in total? Give their full names "
        "(first name, space, last name), the biggest spender first.",
        "SELECT c.first_name || ' ' || c.last_name, SUM(i.total) AS spent FROM customers c "
        "JOIN invoices i ON i.customer_id = c.customer_id WHERE c.country = {country} "
        "GROUP BY c.customer_id ORDER BY spent DESC LIMIT {k}",
        {"country": "SELECT country FROM customers GROUP BY country HAVING COUNT(*) >= 2"},
        kind="top",
        ks=(1, 2),
    ),
    Template(
        "chinook.hard.genre_tracks_above_avg",
        'How many tracks of the genre "{genre}" are longer than the average length of all '
        "tracks in the store?",
        "SELECT COUNT(*) FROM tracks WHERE genre_id = "
        "(SELECT genre_id FROM genres WHERE name = {genre}) "
        "AND milliseconds > (SELECT AVG(milliseconds) FROM tracks)",
        {"genre": "SELECT name FROM genres"},
    ),
    Template(
        "chinook.hard.rep_of_top_customer",
        "Who is the support representative (first name, space, last name) of the customer from "
        "{country} who spent the most in total?",
        "SELECT e.first_name || ' ' || e.last_name, s.spent FROM "
        "(SELECT customer_id, SUM(total) AS spent FROM invoices GROUP BY customer_id) s "
        "JOIN customers c ON c.customer_id = s.customer_id "
        "JOIN employees e ON e.employee_id = c.support_rep_id "
        "WHERE c.country = {country} ORDER BY s.spent DESC LIMIT {k}",
        {"country": "SELECT DISTINCT country FROM customers"},
        kind="top",
    ),
    Template(
        "chinook.hard.big_albums_of_artist",
        'List the titles of the albums by "{artist}" that have more than {n} tracks.',
        "SELECT al.title FROM albums al JOIN artists ar ON ar.artist_id = al.artist_id "
        "JOIN tracks t ON t.album_id = al.album_id WHERE ar.name = {artist} "
        "GROUP BY al.album_id HAVING COUNT(*) > {n}",
        {
            "artist": "SELECT ar.name FROM artists ar JOIN albums al "
            "ON al.artist_id = ar.artist_id GROUP BY ar.artist_id HAVING COUNT(*) >= 2",
            "n": (8, 10, 12, 14, 16),
        },
        kind="set",
    ),
    Template(
        "chinook.hard.big_spenders_in_country",
        "How many customers from {country} spent more in total than the average total "
        "spending per customer?",
        "SELECT COUNT(*) FROM customers c JOIN "
        "(SELECT customer_id, SUM(total) AS spent FROM invoices GROUP BY customer_id) s "
        "ON s.customer_id = c.customer_id WHERE c.country = {country} AND s.spent > "
        "(SELECT AVG(spent) FROM (SELECT SUM(total) AS spent FROM invoices "
        "GROUP BY customer_id))",
        {"country": "SELECT DISTINCT country FROM customers"},
    ),
    Template(
        "chinook.hard.top_artists_revenue",
        "Which {k} artists earned the most from sales (sum of unit price times quantity over "
        "all invoice lines of their tracks)? Give the artist names, the highest first.",
        "SELECT ar.name, SUM(il.unit_price * il.quantity) AS revenue FROM invoice_lines il "
        "JOIN tracks t ON t.track_id = il.track_id JOIN albums al ON al.album_id = t.album_id "
        "JOIN artists ar ON ar.artist_id = al.artist_id GROUP BY ar.artist_id "
        "ORDER BY revenue DESC LIMIT {k}",
        kind="top",
        ks=(1, 2, 3, 4, 5),
    ),
    Template(
        "chinook.hard.playlists_with_artist",
        'List the names of the playlists that contain at least one track by "{artist}".',
        "SELECT DISTINCT p.name FROM playlists p WHERE p.playlist_id IN "
        "(SELECT pt.playlist_id FROM playlist_tracks pt JOIN tracks t ON t.track_id = pt.track_id "
        "JOIN albums al ON al.album_id = t.album_id JOIN artists ar ON ar.artist_id = al.artist_id "
        "WHERE ar.name = {artist})",
        {"artist": "SELECT name FROM artists WHERE artist_id IN (SELECT artist_id FROM albums)"},
        kind="set",
    ),
    # ----------------------------------------------------------------------- flights / easy
    Template(
        "flights.easy.departures_on_day",
        "How many flights departed from {origin} on January {day}, 2013?",
        "SELECT COUNT(*) FROM flights WHERE origin = {origin} AND day = {day} "
        "AND dep_time IS NOT NULL",
        {"origin": _NYC, "day": _DAYS},
    ),
    Template(
        "flights.easy.airline_name",
        'What is the full name of the airline with carrier code "{carrier}"?',
        "SELECT name FROM airlines WHERE carrier = {carrier}",
        {"carrier": "SELECT carrier FROM airlines"},
    ),
    Template(
        "flights.easy.planes_by_maker",
        'How many planes in the planes table were manufactured by "{maker}"?',
        "SELECT COUNT(*) FROM planes WHERE manufacturer = {maker}",
        {"maker": "SELECT DISTINCT manufacturer FROM planes"},
    ),
    Template(
        "flights.easy.airport_altitude",
        'What is the altitude, in feet, of the airport with FAA code "{faa}"?',
        "SELECT alt FROM airports WHERE faa = {faa}",
        {"faa": "SELECT faa FROM airports WHERE faa IN (SELECT DISTINCT dest FROM flights)"},
    ),
    Template(
        "flights.easy.max_delay_to_dest",
        'What was the largest departure delay, in minutes, of a flight to "{dest}" (FAA code)?',
        "SELECT MAX(dep_delay) FROM flights WHERE dest = {dest}",
        {"dest": "SELECT DISTINCT dest FROM flights"},
    ),
    Template(
        "flights.easy.max_temp",
        "What was the highest temperature (temp, in Fahrenheit) recorded at {origin} on "
        "January {day}, 2013?",
        "SELECT MAX(temp) FROM weather WHERE origin = {origin} AND day = {day}",
        {"origin": _NYC, "day": _DAYS},
    ),
    Template(
        "flights.easy.flight_numbers",
        'List the distinct flight numbers that carrier "{carrier}" flew from {origin} to '
        "{dest} in January 2013.",
        "SELECT DISTINCT flight FROM flights WHERE carrier = {carrier} AND origin = {origin} "
        "AND dest = {dest}",
        {"carrier,origin,dest": "SELECT DISTINCT carrier, origin, dest FROM flights"},
        kind="set",
    ),
    # --------------------------------------------------------------------- flights / medium
    Template(
        "flights.medium.airline_departures",
        'How many flights did the airline "{airline}" operate from {origin}?',
        "SELECT COUNT(*) FROM flights f JOIN airlines a ON a.carrier = f.carrier "
        "WHERE a.name = {airline} AND f.origin = {origin}",
        {"airline": "SELECT name FROM airlines", "origin": _NYC},
    ),
    Template(
        "flights.medium.avg_arr_delay_airport",
        'What was the average arrival delay, in minutes, of flights to the airport "{airport}"?',
        "SELECT ROUND(AVG(f.arr_delay), 2) FROM flights f JOIN airports a ON a.faa = f.dest "
        "WHERE a.name = {airport}",
        {"airport": "SELECT name FROM airports WHERE faa IN (SELECT dest FROM flights)"},
        decimals=2,
    ),
    Template(
        "flights.medium.top_dests_from",
        "Which {k} destinations (FAA codes) received the most flights from {origin}? The "
        "busiest first.",
        "SELECT dest, COUNT(*) AS n_flights FROM flights WHERE origin = {origin} "
        "GROUP BY dest ORDER BY n_flights DESC LIMIT {k}",
        {"origin": _NYC},
        kind="top",
        ks=(1, 2, 3, 4, 5),
    ),
    Template(
        "flights.medium.top_airline_delay",
        "Which {k} airlines (full names) had the highest average departure delay? The highest "
        "first.",
        "SELECT a.name, AVG(f.dep_delay) AS avg_delay FROM flights f "
        "JOIN airlines a ON a.carrier = f.carrier GROUP BY a.carrier "
        "ORDER BY avg_delay DESC LIMIT {k}",
        kind="top",
        ks=(1, 2, 3, 4, 5),
    ),
    Template(
        "flights.medium.busiest_day",
        "On which day of January 2013 did the most flights depart from {origin}? Answer with "
        "the day of the month (a number).",
        "SELECT day, COUNT(*) AS n_flights FROM flights WHERE origin = {origin} "
        "GROUP BY day ORDER BY n_flights DESC LIMIT {k}",
        {"origin": _NYC},
        kind="top",
    ),
    Template(
        "flights.medium.n_dests_of_airline",
        'To how many distinct destinations did the airline "{airline}" fly from {origin}?',
        "SELECT COUNT(DISTINCT f.dest) FROM flights f JOIN airlines a ON a.carrier = f.carrier "
        "WHERE a.name = {airline} AND f.origin = {origin}",
        {"airline": "SELECT name FROM airlines", "origin": _NYC},
    ),
    Template(
        "flights.medium.dests_of_airline",
        'List the FAA codes of the destinations the airline "{airline}" flew to from {origin}.',
        "SELECT DISTINCT f.dest FROM flights f JOIN airlines a ON a.carrier = f.carrier "
        "WHERE a.name = {airline} AND f.origin = {origin}",
        {"airline": "SELECT name FROM airlines", "origin": _NYC},
        kind="set",
    ),
    # ----------------------------------------------------------------------- flights / hard
    Template(
        "flights.hard.top_makers_flights",
        "Which {k} aircraft manufacturers built the planes that flew the most flights (flights "
        "whose tail number is in the planes table)? The most first.",
        "SELECT p.manufacturer, COUNT(*) AS n_flights FROM flights f "
        "JOIN planes p ON p.tailnum = f.tailnum GROUP BY p.manufacturer "
        "ORDER BY n_flights DESC LIMIT {k}",
        kind="top",
        ks=(1, 2, 3, 4, 5),
    ),
    Template(
        "flights.hard.above_avg_arr_delay",
        'How many flights to "{dest}" (FAA code) had an arrival delay greater than the '
        "average arrival delay of all flights to that destination?",
        "SELECT COUNT(*) FROM flights WHERE dest = {dest} AND arr_delay > "
        "(SELECT AVG(arr_delay) FROM flights WHERE dest = {dest})",
        {"dest": "SELECT DISTINCT dest FROM flights"},
    ),
    Template(
        "flights.hard.airline_old_planes",
        "Which airline (full name) flew the most flights on planes built before {year}?",
        "SELECT a.name, COUNT(*) AS n_flights FROM flights f "
        "JOIN planes p ON p.tailnum = f.tailnum JOIN airlines a ON a.carrier = f.carrier "
        "WHERE p.year < {year} GROUP BY a.carrier ORDER BY n_flights DESC LIMIT {k}",
        {"year": (1980, 1985, 1990, 1995, 2000, 2005)},
        kind="top",
    ),
    Template(
        "flights.hard.low_visibility_departures",
        "How many flights were scheduled to depart from {origin} in an hour (same day and "
        "hour, weather table) when the visibility was below {visib} miles?",
        "SELECT COUNT(*) FROM flights WHERE origin = {origin} AND (day, hour) IN "
        "(SELECT day, hour FROM weather WHERE origin = {origin} AND visib < {visib})",
        {"origin": _NYC, "visib": (0.5, 1, 2, 3, 5)},
    ),
    Template(
        "flights.hard.longest_air_time",
        "Among destinations with at least {n} flights from {origin}, which {k} have the "
        "longest average air time? Give FAA codes, the longest first.",
        "SELECT dest, AVG(air_time) AS avg_air_time FROM flights WHERE origin = {origin} "
        "GROUP BY dest HAVING COUNT(*) >= {n} ORDER BY avg_air_time DESC LIMIT {k}",
        {"origin": _NYC, "n": (10, 50, 100, 200)},
        kind="top",
        ks=(1, 2, 3),
    ),
    Template(
        "flights.hard.late_airlines",
        "List the full names of the airlines whose average departure delay from {origin} is "
        "above the average departure delay of all flights from {origin}.",
        "SELECT a.name FROM flights f JOIN airlines a ON a.carrier = f.carrier "
        "WHERE f.origin = {origin} GROUP BY a.carrier HAVING AVG(f.dep_delay) > "
        "(SELECT AVG(dep_delay) FROM flights WHERE origin = {origin})",
        {"origin": _NYC},
        kind="set",
    ),
)


def templates_for(db: str, difficulty: str) -> tuple[Template, ...]:
    """The templates of database ``db`` at ``difficulty``."""
    return tuple(t for t in TEMPLATES if t.db == db and t.difficulty == difficulty)
