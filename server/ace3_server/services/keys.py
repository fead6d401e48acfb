"""API key administration (used by the CLI): create, list, revoke. Plaintext keys are never stored."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from ace3_control.models import ApiKey, Owner, utcnow
from ace3_server.auth import generate_key


class OwnerNotFoundError(LookupError):
    pass


@dataclass
class CreatedKey:
    plaintext: str
    key_id: str
    owner_id: str
    lookup_prefix: str


def create_key(session: Session, name: str, owner_id: str | None = None) -> CreatedKey:
    """A new key for an existing owner, or for a new owner named ``name``."""
    if owner_id is None:
        owner = Owner(name=name)
        session.add(owner)
        session.flush()
    else:
        found = session.get(Owner, owner_id)
        if found is None:
            raise OwnerNotFoundError(f"no owner with id {owner_id!r} (see 'ace3 keys list')")
        owner = found
    new = generate_key()
    key = ApiKey(
        owner_id=owner.id, name=name, lookup_prefix=new.lookup_prefix, key_hash=new.key_hash
    )
    session.add(key)
    session.commit()
    return CreatedKey(new.plaintext, key.id, owner.id, new.lookup_prefix)


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at)).all())


def revoke_key(session: Session, lookup_prefix: str) -> bool:
    key = session.scalar(select(ApiKey).where(ApiKey.lookup_prefix == lookup_prefix))
    if key is None or key.revoked_at is not None:
        return False
    key.revoked_at = utcnow()
    session.commit()
    return True
