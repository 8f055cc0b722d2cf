// tasklet/export.hpp: TASKLET_EXPORT marks the public API of tasklet's libraries. A shared build
// compiles everything else with hidden visibility, so only what the public headers need is
// exported (tests/install/check_exports.py checks it); a static build is unaffected.
#pragma once

#define TASKLET_EXPORT [[gnu::visibility("default")]]
