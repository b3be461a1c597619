"""The atlas: the machines measured on the reference model (``entries``), the digest index
behind ``identify --against`` (``digest_index``), and the reference study's published
records (``published``). ``bitdrift.atlas`` keeps the digest index's names it had
before the atlas became a package.
"""

from bitdrift.atlas.digest_index import (  # noqa: F401  (the public names, as before)
    INDEX_FORMAT,
    Entry,
    Index,
    Match,
)
