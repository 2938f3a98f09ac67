using LibuvComparator;
using LibuvComparator.Internal;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.DependencyInjection;

namespace Microsoft.AspNetCore.Hosting;

/// <summary>Puts Kestrel on the libuv comparator transport.</summary>
public static class WebHostBuilderLibuvComparatorExtensions
{
    /// <summary>
    /// Makes Kestrel use the libuv comparator transport for IP endpoints: one libuv loop per thread
    /// over the system's libuv1 (<c>libuv.so.1</c>). For benchmarks against the epoll transport.
    /// </summary>
    /// <param name="builder">The web host builder.</param>
    /// <param name="configure">Configures the transport's options; null keeps the defaults.</param>
    /// <returns>The same builder.</returns>
    public static IWebHostBuilder UseLibuvComparator(this IWebHostBuilder builder, Action<LibuvComparatorOptions>? configure = null)
    {
        ArgumentNullException.ThrowIfNull(builder);

        return builder.ConfigureServices(services =>
        {
            var options = services.AddOptions<LibuvComparatorOptions>();
            if (configure is not null)
            {
                options.Configure(configure);
            }

            // Kestrel asks the most recently registered factory first, so registering after
            // UseKestrel's Sockets factory makes this one win for IP endpoints.
            services.AddSingleton<IConnectionListenerFactory, LibuvTransportFactory>();
        });
    }
}
