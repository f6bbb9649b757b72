"""The shared-governance schema's alembic migrations, shipped inside the installed package.

``mayu migrate`` (:mod:`gateway.schema`) finds this directory with
``importlib.resources``, so an installed wheel or image migrates without a checkout; the
repo-root ``alembic.ini`` points at the same directory for ``alembic upgrade head``.
"""
