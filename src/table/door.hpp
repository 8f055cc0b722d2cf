// Private: what the room above (scheduler) may use of the rule table, and all it may include from
// it (the build checks: see cmake/TaskletDoorCheck.cmake).
//
// Through it: RuleTable's public members (the one way in and out: enter, enter_all, drain, leave,
// discard, hand_over, withdraw; and what the table tells of itself: blockers, wait chains,
// snapshots, counts), RuleRequest and InlineRuleRequest (a holder derives its request from them and
// learns of its grant through granted()), and the RuleBackend it hands shared rules to. The nodes,
// queues, index and lock stay behind RuleTable's private members. A backend outside the engine
// gets the table's socket alone (table/rule_backend.hpp, through api/rule_backend_door.hpp).
#pragma once

#include "table/rule_backend.hpp"
#include "table/rule_request.hpp"
#include "table/rule_table.hpp"
