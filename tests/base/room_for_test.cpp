// room_for: the room a push needs, taken before anything changes, growing as push_back does.
#include "base/room_for.hpp"

#include <gtest/gtest.h>

#include <vector>

#include <boost/container/small_vector.hpp>

namespace tasklet::detail {
namespace {

TEST(RoomForTest, TakesNothingWhenThereIsRoom) {
  std::vector<int> values;
  values.reserve(8);
  values.push_back(1);
  room_for(values, 7);
  EXPECT_EQ(values.capacity(), 8u);
}

TEST(RoomForTest, GrowsGeometricallySoThatRepeatedPushesStayAmortised) {
  std::vector<int> values;
  values.reserve(4);
  values.assign({1, 2, 3, 4});
  room_for(values);
  EXPECT_GE(values.capacity(), 8u);  // twice, not one more
  room_for(values, 100);
  EXPECT_GE(values.capacity(), 104u);  // at least what was asked for
  EXPECT_EQ(values, (std::vector<int>{1, 2, 3, 4}));
}

TEST(RoomForTest, ThePushesThatFollowDoNotReallocate) {
  boost::container::small_vector<int, 2> values{1, 2};
  room_for(values, 3);
  const int* before = values.data();
  for (int value = 3; value <= 5; ++value) values.push_back(value);
  EXPECT_EQ(values.data(), before);
  EXPECT_EQ(values.size(), 5u);
}

}  // namespace
}  // namespace tasklet::detail
