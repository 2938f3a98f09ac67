using Kestrel.Transport.Linux;
using Kestrel.Transport.Linux.Hosting;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.DependencyInjection.Extensions;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Options;

namespace Microsoft.AspNetCore.Hosting;

/// <summary>Extension methods that put Kestrel on the Linux transport.</summary>
public static class WebHostBuilderLinuxTransportExtensions
{
    /// <summary>
    /// Makes Kestrel use the Linux transport for IP, Unix-socket and file-handle endpoints.
    /// Options bind from the <c>Kestrel:LinuxTransport</c> configuration section.
    /// On an operating system other than Linux Kestrel stays on the Sockets transport, one log line says so, and the
    /// options are still validated at start-up. With <c>Kestrel:LinuxTransport:Enabled</c> set to false it stays on Sockets
    /// too, and nothing else of the section is read, so a bad value there cannot block the way back.
    /// </summary>
    /// <param name="hostBuilder">The web host builder.</param>
    /// <returns>The same builder.</returns>
    public static IWebHostBuilder UseLinuxTransport(this IWebHostBuilder hostBuilder)
        => hostBuilder.UseLinuxTransport(static _ => { });

    /// <summary>
    /// Makes Kestrel use the Linux transport, with options configured in code after those bound from
    /// the <c>Kestrel:LinuxTransport</c> configuration section. Calling it again adds the configuration, not a
    /// second transport.
    /// </summary>
    /// <param name="hostBuilder">The web host builder.</param>
    /// <param name="configureOptions">Configures the transport's options.</param>
    /// <returns>The same builder.</returns>
    public static IWebHostBuilder UseLinuxTransport(this IWebHostBuilder hostBuilder, Action<LinuxTransportOptions> configureOptions)
    {
        ArgumentNullException.ThrowIfNull(hostBuilder);
        ArgumentNullException.ThrowIfNull(configureOptions);

        return hostBuilder.ConfigureServices((context, services) =>
            AddLinuxTransport(services, context.Configuration, configureOptions, OperatingSystem.IsLinux()));
    }

    /// <summary>The registration, with the operating system's answer passed in so that tests can take the other branch.</summary>
    internal static void AddLinuxTransport(
        IServiceCollection services, IConfiguration configuration, Action<LinuxTransportOptions> configureOptions, bool isLinux)
    {
        var section = configuration.GetSection(LinuxTransportOptions.ConfigurationSectionName);
        if (isLinux && !section.GetValue(EnabledKey, true))
        {
            // The way back in an emergency: nothing of the section is bound or validated, so a value that stops this
            // transport from starting (or one that only a newer package knows) cannot also stop the rollback.
            AddNotice(services, $"{LinuxTransportOptions.ConfigurationSectionName}:{EnabledKey} is false; its other settings are not read");
            return;
        }

        var options = services.AddOptions<LinuxTransportOptions>()
            .Bind(section)
            .Configure(configureOptions);
        services.TryAddEnumerable(ServiceDescriptor.Singleton<IValidateOptions<LinuxTransportOptions>, LinuxTransportOptionsValidator>());

        if (!isLinux)
        {
            // The transport stays off, but a configuration error still fails start-up here, on a developer's machine,
            // not first where the transport runs.
            options.ValidateOnStart();
            AddNotice(services, $"this is not Linux ({System.Runtime.InteropServices.RuntimeInformation.OSDescription})");
            return;
        }

        // Kestrel asks the most recently registered factory first, so adding ours after UseKestrel's Sockets factory
        // makes it win for every endpoint it can bind. TryAddEnumerable: a second call registers no second factory.
        services.TryAddEnumerable(ServiceDescriptor.Singleton<IConnectionListenerFactory, LinuxTransportFactory>());
    }

    private static void AddNotice(IServiceCollection services, string reason)
        => services.TryAddEnumerable(ServiceDescriptor.Singleton<IHostedService, SocketsStayNotice>(
            provider => new SocketsStayNotice(provider.GetRequiredService<ILoggerFactory>(), reason)));

    /// <summary>
    /// <c>Kestrel:LinuxTransport:Enabled</c>: false leaves Kestrel on its Sockets transport without a code change (the way
    /// back, as an environment variable <c>Kestrel__LinuxTransport__Enabled=false</c>). A configuration key only: in code,
    /// leaving out UseLinuxTransport() does the same.
    /// </summary>
    private const string EnabledKey = "Enabled";
}
