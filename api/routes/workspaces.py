"""``/api/v1/workspaces`` and ``/api/v1/projects``: what the WebUI's workspace and project
pages read, as the user sees them (row-level security)."""

from fastapi import APIRouter

from det.api.params import IntId
from det.api.session import Session, session
from det.queries import workspaces as q
from det.sql import named

READ = named("queries")
router = APIRouter(prefix="/api/v1", tags=["workspaces"])


@router.get("/workspaces")
def list_workspaces(s: Session = session) -> dict:
    """The workspaces the user may view, archived ones included, with their numbers of
    projects and experiments and their bound pools."""
    return {"workspaces": s.conn.execute(READ.workspaces, {"all": True, "name": None}).fetchall()}


@router.get("/workspaces/{workspace_id}")
def get_workspace(workspace_id: IntId, s: Session = session) -> dict:
    """One workspace with its projects (``project_list``); 404 if the user may not view it."""
    return q.workspace_by_id(s.conn, workspace_id)


@router.get("/projects/{project_id}")
def get_project(project_id: IntId, s: Session = session) -> dict:
    """One project with its workspace's name; 404 if the user may not view it."""
    return q.project_by_id(s.conn, project_id)
