// The checkpoint library in one include: saving (checkpointer.h), finding and reading (reader.h),
// the tools (cli.h). Format: format.h and docs/checkpoint_format.md.
#pragma once
#include "checkpoint/checkpointer.h"  // IWYU pragma: export
#include "checkpoint/cli.h"           // IWYU pragma: export
#include "checkpoint/reader.h"        // IWYU pragma: export
