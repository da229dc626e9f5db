"""``/openai/v1/files``: OpenAI's Files API for batch input files (``FileService``) and batch output files.

An upload is ``multipart/form-data`` (``file``, ``purpose``, ``expires_after[anchor]``,
``expires_after[seconds]``): Starlette spools the file part to disk past a mebibyte, and the service
stores it chunk by chunk from there. A batch's output and error files are stored the same way, written
when the batch ended (``batch_files``). Left out of ``/openapi.json``, as the rest of the face.
"""

from __future__ import annotations

import functools
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.datastructures import UploadFile

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.openai.errors import OPENAI_PREFIX, invalid
from api_gateway.openai.file_service import file_object

__all__ = ["router"]

router = APIRouter(prefix=OPENAI_PREFIX + "/files", route_class=AuthenticatedRoute, include_in_schema=False)

_MAX_FORM_FIELDS = 16


@router.post("")
async def upload_file(request: Request, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Store an uploaded file (``purpose: batch``)."""
    try:
        form = await request.form(max_files=1, max_fields=_MAX_FORM_FIELDS)
    except (ValueError, KeyError) as exc:  # a body that is not multipart, or a malformed one
        raise invalid(f"the body must be multipart/form-data with a file: {exc}", ("file",)) from exc
    try:
        part = form.get("file")
        upload = part if isinstance(part, UploadFile) else None
        expiry = None
        if form.get("expires_after[anchor]") is not None or form.get("expires_after[seconds]") is not None:
            expiry = (form.get("expires_after[anchor]"), form.get("expires_after[seconds]"))
        store = functools.partial(
            gateway.file_service.upload, None if upload is None else upload.file,
            filename=None if upload is None else upload.filename, purpose=form.get("purpose"),
            expires_after=expiry, org_id=caller.org_id,
        )  # fmt: skip
        created = await run_in_threadpool(store)
    finally:
        await form.close()
    return JSONResponse(created)


@router.get("")
async def list_files(
    caller: Caller,
    gateway: Gateway,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> JSONResponse:
    """The caller's files, in OpenAI's list shape with cursor pagination."""
    page = functools.partial(
        gateway.file_service.page, org_id=caller.org_id, after=after, limit=limit, ascending=order == "asc",
        purpose=purpose,
    )  # fmt: skip
    return JSONResponse(await run_in_threadpool(page))


@router.get("/{file_id}")
async def retrieve_file(file_id: str, caller: Caller, gateway: Gateway) -> JSONResponse:
    """The file's ``FileObject``."""
    record = await run_in_threadpool(gateway.file_service.get, file_id, org_id=caller.org_id)
    return JSONResponse(file_object(record))


@router.get("/{file_id}/content")
async def file_content(file_id: str, caller: Caller, gateway: Gateway) -> StreamingResponse:
    """The file's bytes, streamed (a batch's output and error files rendered from its turns)."""
    record = await run_in_threadpool(gateway.file_service.get, file_id, org_id=caller.org_id)
    content = gateway.file_service.content(record)
    return StreamingResponse(iterate_in_threadpool(content), media_type="application/octet-stream")


@router.delete("/{file_id}")
async def delete_file(file_id: str, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Delete the file (``FileDeleted``)."""
    return JSONResponse(await run_in_threadpool(gateway.file_service.delete, file_id, org_id=caller.org_id))
