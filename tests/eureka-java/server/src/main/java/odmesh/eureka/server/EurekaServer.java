package odmesh.eureka.server;

import java.io.IOException;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.ApplicationRunner;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.netflix.eureka.server.EnableEurekaServer;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.security.config.Customizer;
import org.springframework.security.config.annotation.web.builders.HttpSecurity;
import org.springframework.security.core.userdetails.User;
import org.springframework.security.core.userdetails.UserDetailsService;
import org.springframework.security.provisioning.InMemoryUserDetailsManager;
import org.springframework.security.web.SecurityFilterChain;

/**
 * A stock Spring Cloud Netflix Eureka server. Everything but authentication is set by
 * properties on the command line (tests/src/java_eureka.rs gives them).
 *
 * <p>{@code --odmesh.test.basic-auth=user:password} makes every request need HTTP Basic with
 * these credentials (401 without), as "Securing The Eureka Server" in Spring Cloud Netflix's
 * docs sets it up: CSRF stays on except for {@code /eureka/**}, where clients and peers send
 * POST, PUT and DELETE without a token. Without the property everything is open.
 *
 * <p>{@code --odmesh.test.exit-on-stdin-eof=true} stops the server when its stdin closes: a
 * test holds the pipe, so a server never outlives the test that started it, even one killed.
 */
@SpringBootApplication
@EnableEurekaServer
public class EurekaServer {

    public static void main(String[] args) {
        SpringApplication.run(EurekaServer.class, args);
    }

    @Bean
    ApplicationRunner exitOnStdinEof(ConfigurableApplicationContext context,
            @Value("${odmesh.test.exit-on-stdin-eof:false}") boolean exitOnEof) {
        return args -> {
            if (!exitOnEof) {
                return;
            }
            Thread watch = new Thread(() -> {
                try {
                    while (System.in.read() != -1) {
                        // Nothing is sent; only the end of input counts.
                    }
                } catch (IOException e) {
                    // Read as the end of input.
                }
                System.exit(SpringApplication.exit(context));
            }, "odmesh-stdin-eof");
            watch.setDaemon(true);
            watch.start();
        };
    }

    @Bean
    SecurityFilterChain securityFilterChain(HttpSecurity http,
            @Value("${odmesh.test.basic-auth:}") String basicAuth) throws Exception {
        if (basicAuth.isEmpty()) {
            http.authorizeHttpRequests(a -> a.anyRequest().permitAll()).csrf(csrf -> csrf.disable());
        } else {
            http.authorizeHttpRequests(a -> a.anyRequest().authenticated())
                .httpBasic(Customizer.withDefaults())
                .csrf(csrf -> csrf.ignoringRequestMatchers("/eureka/**"));
        }
        return http.build();
    }

    /** The one user of {@code odmesh.test.basic-auth}, or none (so Boot generates no password). */
    @Bean
    UserDetailsService users(@Value("${odmesh.test.basic-auth:}") String basicAuth) {
        InMemoryUserDetailsManager users = new InMemoryUserDetailsManager();
        int colon = basicAuth.indexOf(':');
        if (!basicAuth.isEmpty()) {
            if (colon <= 0) {
                throw new IllegalArgumentException("odmesh.test.basic-auth must be user:password");
            }
            users.createUser(User.withUsername(basicAuth.substring(0, colon))
                .password("{noop}" + basicAuth.substring(colon + 1))
                .roles("EUREKA")
                .build());
        }
        return users;
    }
}
