package io.kdq.spark.sqlendpoint;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.Map;
import javax.security.sasl.AuthenticationException;
import org.junit.jupiter.api.Test;

class SqlPasswordAuthenticatorTest {
  @Test
  void rightUserAndPasswordPass() {
    var auth = new SqlPasswordAuthenticator(Map.of("KDQ_SQL_PASSWORD", "s3cret", "KDQ_SQL_USER", "analyst"));
    assertDoesNotThrow(() -> auth.Authenticate("analyst", "s3cret"));
  }

  @Test
  void defaultUserIsKdq() {
    var auth = new SqlPasswordAuthenticator(Map.of("KDQ_SQL_PASSWORD", "s3cret"));
    assertDoesNotThrow(() -> auth.Authenticate("kdq", "s3cret"));
    assertThrows(AuthenticationException.class, () -> auth.Authenticate("analyst", "s3cret"));
  }

  @Test
  void wrongPasswordOrUserIsRefused() {
    var auth = new SqlPasswordAuthenticator(Map.of("KDQ_SQL_PASSWORD", "s3cret"));
    assertThrows(AuthenticationException.class, () -> auth.Authenticate("kdq", "s3cre"));
    assertThrows(AuthenticationException.class, () -> auth.Authenticate("kdq", "s3cret "));
    assertThrows(AuthenticationException.class, () -> auth.Authenticate("kdq", null));
    assertThrows(AuthenticationException.class, () -> auth.Authenticate(null, "s3cret"));
  }

  @Test
  void withoutAConfiguredPasswordEveryLoginIsRefused() {
    assertThrows(AuthenticationException.class, () -> new SqlPasswordAuthenticator(Map.of()).Authenticate("kdq", ""));
    var empty = new SqlPasswordAuthenticator(Map.of("KDQ_SQL_PASSWORD", ""));
    assertThrows(AuthenticationException.class, () -> empty.Authenticate("kdq", ""));
  }
}
