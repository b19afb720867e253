package odmesh.eureka.client;

import java.util.List;

import com.netflix.discovery.Jersey3DiscoveryClientOptionalArgs;
import com.netflix.discovery.shared.transport.jersey3.Jersey3TransportClientFactories;

import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.web.client.RestClient;

/**
 * The Eureka client's transport, each with a {@link Traffic} tap.
 *
 * <p>By default Spring Cloud Netflix's RestClient: its DiscoveryClientOptionalArgsConfiguration
 * builds the Eureka RestClient from the context's {@code RestClient.Builder} when there is one.
 * With {@code eureka.client.jersey.enabled=true}, Eureka's own Jersey 3 client (what Netflix's
 * eureka-client and Eureka servers use): Spring Cloud Netflix selects it then, but only its
 * server module declares the two beans it needs, so they are declared here, as
 * EurekaServerJerseyClientAutoConfiguration does.
 */
@Configuration(proxyBeanMethods = false)
class Transports {

    @Bean
    RestClient.Builder eurekaRestClientBuilder() {
        return RestClient.builder().requestInterceptor(new Traffic.RestClientTap());
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnProperty(name = "eureka.client.jersey.enabled", havingValue = "true")
    static class Jersey3 {

        @Bean
        Jersey3DiscoveryClientOptionalArgs jersey3DiscoveryClientOptionalArgs() {
            Jersey3DiscoveryClientOptionalArgs args = new Jersey3DiscoveryClientOptionalArgs();
            args.setAdditionalFilters(List.of(new Traffic.JerseyTap()));
            return args;
        }

        @Bean
        Jersey3TransportClientFactories jersey3TransportClientFactories() {
            return Jersey3TransportClientFactories.getInstance();
        }
    }
}
