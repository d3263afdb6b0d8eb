"""Database access: where the database is (``DET_DB_URL`` or the embedded server), connections,
and the migrations (``db/migrations``) that bring a database to ``schema.sql``."""

from det.db.connect import connect, database_url, det_home, owner_url, role_url
from det.db.migrate import migrate

__all__ = ["connect", "database_url", "det_home", "migrate", "owner_url", "role_url"]
