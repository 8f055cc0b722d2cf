// tasklet/stop_token.hpp: StopToken, the stop token a coroutine tasklet is given and reads.
//
// make_tasklet(task, rule, token) takes any stoppable token: a std::stop_token, or a token of the
// application's own (anything with noexcept stop_requested() and stop_possible()), which a
// StopToken holds and `co_await tasklet::this_stop_token()` gives back. Not every standard library
// has std::stop_token (libc++ 14 has none), so the library names none itself.
//
//   std::stop_source stop;
//   auto tasklet = tasklet::make_tasklet(copy_files(), nullptr, stop.get_token());
//   ...
//   tasklet::Task<> copy_files() {
//     const tasklet::StopToken stop = co_await tasklet::this_stop_token();
//     while (!stop.stop_requested()) { ... }
//   }
#pragma once

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

#include "tasklet/detail/allocator.hpp"

namespace tasklet {

class StopToken;

/// A token that tells whether a stop was asked for (std::stop_token, or one of the application's
/// own): copyable, with noexcept stop_requested() and stop_possible(), as std::stop_token has.
/// (StopToken itself is left out first: its own copies are no conversion, and asking whether it is
/// copyable would ask this again.)
template <class Token>
concept StoppableToken =
    !std::same_as<Token, StopToken> && std::copy_constructible<Token> && requires(const Token& token) {
  { token.stop_requested() }
  noexcept->std::convertible_to<bool>;
  { token.stop_possible() }
  noexcept->std::convertible_to<bool>;
};

/// Holds a StoppableToken of any type; copies share it. An empty one (the default) is never
/// stopped and stop_possible() is false. Asking it is as thread-safe as asking the token it holds
/// (a std::stop_token may be asked on any thread).
class StopToken {
 public:
  StopToken() noexcept = default;
  /// Holds `token`. Implicit, so that make_tasklet takes a std::stop_token as it is. Throws
  /// std::bad_alloc.
  template <StoppableToken Token>
  StopToken(Token token)  // NOLINT(google-explicit-constructor): any token converts
      : held_(std::allocate_shared<Held<Token>>(detail::Allocator<Held<Token>>{}, std::move(token))) {}

  /// Whether a stop was asked for through the token it holds.
  [[nodiscard]] bool stop_requested() const noexcept { return held_ && held_->stop_requested(); }
  /// Whether a stop can still be asked for (false for an empty StopToken).
  [[nodiscard]] bool stop_possible() const noexcept { return held_ && held_->stop_possible(); }

 private:
  struct Holder {
    Holder() = default;
    Holder(const Holder&) = delete;
    Holder& operator=(const Holder&) = delete;
    virtual ~Holder() = default;
    virtual bool stop_requested() const noexcept = 0;
    virtual bool stop_possible() const noexcept = 0;
  };
  template <class Token>
  struct Held final : Holder {
    explicit Held(Token held) noexcept(std::is_nothrow_move_constructible_v<Token>)
        : token(std::move(held)) {}
    bool stop_requested() const noexcept override { return static_cast<bool>(token.stop_requested()); }
    bool stop_possible() const noexcept override { return static_cast<bool>(token.stop_possible()); }
    Token token;
  };

  std::shared_ptr<const Holder> held_;
};

}  // namespace tasklet
