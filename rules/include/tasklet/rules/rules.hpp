// tasklet/rules/rules.hpp: the built-in scheduling rules (placeholder until the rules land).
#pragma once

#include "tasklet/scheduling_rule.hpp"
