// tests/test_support.h: helpers shared by the test programs.
//
//   EXPECT_THROW_MSG(add(a, b), ShapeError, "add:", "[2, 3]", "[4]");
#pragma once

#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

// Checks that `statement` throws exactly `exception_type` (or a subclass) and that what() contains every
// one of the given pieces; prints the whole message when a piece is missing.
#define EXPECT_THROW_MSG(statement, exception_type, ...)                                            \
  do {                                                                                              \
    bool caught_ = false;                                                                           \
    try {                                                                                           \
      statement;                                                                                    \
    } catch (const exception_type& e_) {                                                            \
      caught_ = true;                                                                               \
      const std::string what_ = e_.what();                                                          \
      for (std::string_view piece_ : std::initializer_list<std::string_view>{__VA_ARGS__}) {        \
        EXPECT_NE(what_.find(piece_), std::string::npos)                                            \
            << "message of " #exception_type " lacks \"" << piece_ << "\"; message was:\n" << what_; \
      }                                                                                             \
    } catch (const std::exception& e_) {                                                            \
      ADD_FAILURE() << #statement " threw a different exception than " #exception_type ": " << e_.what(); \
      caught_ = true;                                                                               \
    }                                                                                               \
    if (!caught_) ADD_FAILURE() << #statement " did not throw " #exception_type;                  \
  } while (0)
