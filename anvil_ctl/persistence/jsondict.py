"""The preset dictionary `coltypes.pack` deflates JSON bodies against (migration 0015 on).

A step's detail, a transaction's arguments or a snapshot body is a few hundred bytes of
JSON, most of it member names that every body of its kind repeats: deflated alone, each
body pays for them again (and for zlib's header and checksum). Deflated against this
dictionary, one text that holds those names as the bodies have them, a body pays only for
its values (`pack`, tag `00 79`; about 0.9 KB less per transaction than `00 7a`).

The dictionary is the bodies' shapes only: their member names, in the order canonical JSON
writes them, with every value blank (strings empty, numbers 0), slot and GPU role names
blank too (they are a host's configuration), and a few fixed strings of the design (a
loopback binding, an image ID's `sha256:`, a GPU UUID's `GPU-`, our labels). It was taken
from the bodies of a load, promote and rollback on the shipped fakes; deflate finds the
nearest copy first, so the most frequent bodies (step details) come last.

**Never change `JSON_V1`**: every value packed with it inflates only against these exact
bytes. A better dictionary is a new constant with a new tag beside it.
"""

from __future__ import annotations

_FIXED = (
    '"sha256:"http://127.0.0.1:"127.0.0.1:"GPU-"io.anvil.managed"io.anvil.slot"io.anvil.role"'
    '"io.anvil.recipe-digest"io.anvil.transaction"/health"'
)

_SHAPES = (
    '{"gpu_owners":{},"host":"","schema":0,"shm_residue":[],"slots":{"":{"binding":"","containers":{},"incumbent":{"container_id":null,"identity_digest":null,"served_model":null},"router":{"backends":[{"aliases":[""],"healthy":true,"observed_model":"","state":"","url":""}],"ready":true,"router":"","tier":""},"serving":{"answering":true,"healthy":true,"models":[[""]]}}}}',
    '{"gpu_owners":{"":{"container_id":"","mode":""}},"host":"","schema":0,"shm_residue":[],"slots":{"":{"binding":"","containers":{"":{"fingerprint":"","gpu_uuids":[],"id":"","image_id":"","managed":false,"name":"","role":null,"served_model":null,"status":""}},"incumbent":{"container_id":"","identity_digest":"","served_model":""},"router":{"backends":[{"aliases":[""],"healthy":true,"observed_model":"","state":"","url":""}],"ready":true,"router":"","tier":""},"serving":{"answering":true,"healthy":true,"models":[[""]]}}}}',
    '{"gpu_owners":{"":{"container_id":"","mode":""}},"host":"","schema":0,"shm_residue":[],"slots":{"":{"binding":"","containers":{"":{"fingerprint":"","gpu_uuids":[""],"id":"","image_id":"","managed":true,"name":"","role":"","served_model":null,"status":""}},"incumbent":{"container_id":"","identity_digest":"","served_model":""},"router":{"backends":[{"aliases":[""],"healthy":true,"observed_model":"","state":"","url":""}],"ready":true,"router":"","tier":""},"serving":{"answering":true,"healthy":true,"models":[[""]]}}}}',
    '{"identity":{"aliases":[""],"binding":"","config_fingerprint":"","container_id":"","container_name":"","context_tokens":0,"engine_profile":"","gpu_roles":[""],"image_id":"","model_identity":"","recipe_digest":"","repo_digests":[],"router_tier":"","served_model":"","slot":""},"slot":""}',
    '{"accept_drift":null,"candidate":{"context_tokens":0,"engine_profile":"","gpu_roles":[""],"health_path":"","max_concurrency":0,"model_files":[],"model_identity":"","recipe":"","recipe_digest":"","served_model":"","spec":{"command":[],"entrypoint":null,"env":[[""]],"gpu_uuids":[""],"image":"","init":true,"ipc_mode":null,"labels":[[""]],"mounts":[],"name":"","network_mode":"","ports":[],"shm_size":null,"ulimits":[],"working_dir":null},"startup_timeout_s":0,"vram_need_mib":0},"incumbent":{"aliases":[""],"binding":"","config_fingerprint":"","container_id":"","container_name":"","context_tokens":0,"engine_profile":"","gpu_roles":[""],"image_id":"","model_identity":"","recipe_digest":"","repo_digests":[],"router_tier":"","served_model":"","slot":""},"incumbent_running":true,"slot":""}',
    '{"accept_drift":null,"approved_by":"","candidate":{"aliases":[""],"binding":"","config_fingerprint":"","container_id":"","container_name":"","context_tokens":0,"engine_profile":"","gpu_roles":[""],"image_id":"","model_identity":"","recipe_digest":"","repo_digests":[],"router_tier":"","served_model":"","slot":""},"decision_id":"","incumbent":{"aliases":[""],"binding":"","config_fingerprint":"","container_id":"","container_name":"","context_tokens":0,"engine_profile":"","gpu_roles":[""],"image_id":"","model_identity":"","recipe_digest":"","repo_digests":[],"router_tier":"","served_model":"","slot":""},"slot":""}',
    '{"current":{"aliases":[""],"binding":"","config_fingerprint":"","container_id":"","container_name":"","context_tokens":0,"engine_profile":"","gpu_roles":[""],"image_id":"","model_identity":"","recipe_digest":"","repo_digests":[],"router_tier":"","served_model":"","slot":""},"current_role":"","current_routed":true,"recorded_sha256":"","recorded_snapshot":null,"restore_group":null,"restore_group_members":null,"slot":"","target":{"aliases":[""],"binding":"","config_fingerprint":"","container_id":"","container_name":"","context_tokens":0,"engine_profile":"","gpu_roles":[""],"image_id":"","model_identity":"","recipe_digest":"","repo_digests":[],"router_tier":"","served_model":"","slot":""}}',
    '{"identity_digest":""}',
    '{"harbour":"","models":[""],"routed_model":"","router":true,"serving":true,"slot":""}',
    '{"tier":""}',
    '{"container_id":"","status":""}',
    '{"after":{"GPU-":{"free_mib":0,"index":0,"processes":[],"total_mib":0,"used_mib":0}},"before":{"GPU-":{"free_mib":0,"index":0,"processes":[],"total_mib":0,"used_mib":0}},"deadline_s":0,"need_mib":0,"polls":0,"released":true,"required_free_mib":{"GPU-":0},"reserve_mib":{"":0},"roles":{"":""},"waited_s":0,"waivers":[]}',
    '{"container_id":"","name":""}',
    '{"first_poll":{"healthy":true,"listening":true,"models":[""]},"health_path":"","healthy":true,"polls":0,"served_model":"","url":"","waited_s":0}',
    '{"container_id":"","identity_digest":""}',
    '{"harbour":null,"models":[""],"routed_model":null,"router":true,"serving":false,"slot":""}',
    '{"answer_model":"","routed_to":"","tier":""}',
    '{"alias":"","model":"","served_model":"","status":0}',
    '{"checks":{"plain_chat":true,"streaming_chat":true,"tool_call":true},"model":"","passed":true}',
    '{"artifact":"","cards":[{"free_mib":0,"margin_mib":0,"passed":true,"role":"","threshold_mib":0,"total_mib":0,"used_mib":0,"uuid":""}],"gate":"","manifest_sha256":"","margin_mib":0,"passed":true,"policy":"","standing_mib":{"":0},"threshold_mib":{"":0},"waivers":[],"when":""}',
    '{"approved_by":"","decision_id":"","incumbent":"","rollback":"","vram_after_acceptance":{"manifest_sha256":"","passed":true,"step":""}}',
    '{"container_id":"","first_poll":{"healthy":true,"listening":true,"models":[""]},"health_path":"","healthy":true,"polls":0,"served_model":"","url":"","waited_s":0}',
    '{"incumbent":""}',
)

JSON_V1: bytes = (_FIXED + "".join(_SHAPES)).encode()
"""The preset dictionary of tag `00 79` (see the module doc)."""
