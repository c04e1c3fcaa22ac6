/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Map and event layouts shared by sandbox_egress.bpf.c and the loader. The
 * structs are generated from bpf/layouts.json (sandbox_egress_layouts.h), as is
 * their TypeScript twin src/native/bpf-layouts.ts.
 */
#ifndef WARREN_SANDBOX_EGRESS_H
#define WARREN_SANDBOX_EGRESS_H

#include "sandbox_egress_layouts.h"

/* Pinned names, relative to the node's pin directory. */
#define EGRESS_MAP_POLICIES "sandbox_policies"
#define EGRESS_MAP_ALLOW "egress_allow"
#define EGRESS_MAP_CIDRS "egress_cidrs"
#define EGRESS_MAP_EVENTS "egress_events"
#define EGRESS_MAP_DENY "egress_deny"

#endif
