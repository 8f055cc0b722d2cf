// tasklet.hpp: the umbrella header. Include it, or the individual headers below.
#pragma once

#include "tasklet/api.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/error.hpp"
#include "tasklet/job.hpp"
#include "tasklet/job_group.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/progress_monitor.hpp"
#include "tasklet/rules/rules.hpp"
#include "tasklet/scheduler.hpp"
#include "tasklet/scheduling_rule.hpp"
#include "tasklet/serial_executor.hpp"
#include "tasklet/status.hpp"
#include "tasklet/tasklet.hpp"
#include "tasklet/workers.hpp"
