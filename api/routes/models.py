"""``/api/v1/models``: the model registry (spec: introduction-and-features, Model Registry):
models, their versions, a checkpoint registered as a version. Each change is one
``det_model_*`` function (schema.sql), as ``det model`` calls it; a model is named by its name
(any case) or id. A version's files are ``GET /api/v1/checkpoints/{uuid}/download``."""

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field

from det.api.session import Session, session
from det.sql import named

Q = named("api")
READ = named("queries")

router = APIRouter(prefix="/api/v1", tags=["models"])

ModelName = Annotated[str, Path(max_length=255, description="Model name (any case) or id.")]


@router.get("/models")
def list_models(s: Session = session,
                archived: bool = Query(False, description="Include archived models.")) -> dict:
    """The models the user may view: name, description, labels, owner, versions, times."""
    return {"models": s.conn.execute(READ.models, {"all": archived}).fetchall()}


class CreateModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=255, description="Unique name (any case; not only digits, "
                                                  "no slashes).")
    description: str = Field("", description="One-line description.")
    labels: list[str] | None = None
    workspace: str | None = Field(None, description="Its workspace (default: Uncategorized).")


@router.post("/models", status_code=201)
def create_model(body: CreateModel, s: Session = session) -> dict:
    """`det model create`: an empty model, the caller's, in a workspace where they are an
    Editor (403); 409 for a name taken, 400 naming a bad field."""
    row = s.conn.execute(Q.model_create, (body.name, body.description, body.labels,
                                          body.workspace)).fetchone()
    return s.conn.execute(READ.model, {"id": row["id"]}).fetchone()


@router.get("/models/{model}")
def get_model(model: ModelName, s: Session = session) -> dict:
    """A model and its versions (checkpoint, trial, experiment, batches, size, validation
    metrics); 404 for one the caller cannot view."""
    model_id = s.conn.execute(READ.find_model, {"model": model}).fetchone()["id"]
    return {**s.conn.execute(READ.model, {"id": model_id}).fetchone(),
            "versions": s.conn.execute(READ.model_versions,
                                       {"id": model_id, "version": None}).fetchall()}


class RegisterVersion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint: str = Field(max_length=64, description="The checkpoint's UUID.")
    name: str | None = Field(None, description="Version name.")
    notes: str | None = Field(None, description="Notes (Markdown).")
    labels: list[str] | None = None
    metadata: dict[str, Any] | None = None


@router.post("/models/{model}/versions", status_code=201)
def register_version(model: ModelName, body: RegisterVersion, s: Session = session) -> dict:
    """`det model register-version`: the checkpoint (COMPLETED, else 409) becomes the model's
    next version and is pinned; Editor of the model's workspace and of the checkpoint's
    (403), 404 for a checkpoint or model the caller cannot view."""
    row = s.conn.execute(
        Q.model_register_version,
        (model, body.checkpoint, body.name, body.notes, body.labels,
         Jsonb(body.metadata) if body.metadata is not None else None)).fetchone()
    return s.conn.execute(READ.model_versions, {"id": row["model_id"], "version": row["version"]}
                          ).fetchone()
