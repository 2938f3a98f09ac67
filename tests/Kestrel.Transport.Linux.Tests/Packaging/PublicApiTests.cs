using System.Reflection;
using System.Text;
using Microsoft.AspNetCore.Hosting;

namespace Kestrel.Transport.Linux.Tests.Packaging;

/// <summary>
/// The public surface is tracked in src/Transport.Linux/PublicAPI.Shipped.txt and PublicAPI.Unshipped.txt
/// (the format of Roslyn's PublicApiAnalyzers, which the NuGet mirror here does not carry). A change to the
/// public API fails this test until the files say so, which makes every API change a reviewed one.
/// </summary>
public sealed class PublicApiTests
{
    [Fact]
    public void The_public_surface_is_exactly_what_the_PublicAPI_files_declare()
    {
        var declared = ReadDeclared();
        var actual = Describe(typeof(LinuxTransportOptions).Assembly).ToHashSet(StringComparer.Ordinal);

        var undeclared = actual.Except(declared).Order(StringComparer.Ordinal).ToList();
        var missing = declared.Except(actual).Order(StringComparer.Ordinal).ToList();
        Assert.True(
            undeclared.Count == 0 && missing.Count == 0,
            $"Public API differs from the PublicAPI files.{Environment.NewLine}" +
            $"Public but not declared (add to PublicAPI.Unshipped.txt):{Environment.NewLine}  {string.Join(Environment.NewLine + "  ", undeclared)}{Environment.NewLine}" +
            $"Declared but not public:{Environment.NewLine}  {string.Join(Environment.NewLine + "  ", missing)}");
    }

    /// <summary>
    /// A public option is a promise to a user: there are at most 12, and each one's XML doc says who turns it on
    /// (or changes it) and when, as a sentence beginning "Who".
    /// </summary>
    [Fact]
    public void Options_are_at_most_twelve_and_each_says_who_sets_it()
    {
        var options = typeof(LinuxTransportOptions).GetProperties(BindingFlags.Public | BindingFlags.Instance)
            .Where(static p => p.SetMethod is { IsPublic: true })
            .ToList();
        Assert.InRange(options.Count, 1, 12);

        var docs = System.Xml.Linq.XDocument.Load(Path.ChangeExtension(typeof(LinuxTransportOptions).Assembly.Location, ".xml"));
        foreach (var option in options)
        {
            string member = $"P:{typeof(LinuxTransportOptions).FullName}.{option.Name}";
            var summary = docs.Descendants("member").SingleOrDefault(m => (string?)m.Attribute("name") == member)?.Element("summary")?.Value ?? "";
            Assert.True(
                System.Text.RegularExpressions.Regex.IsMatch(summary, @"\bWho (changes|turns|sets)\b"),
                $"{option.Name}'s doc has no user story (\"Who turns it on ...\"): {summary.Trim()}");
        }
    }

    /// <summary>
    /// The assembly is unsigned, so a grant of its internals reaches any assembly that takes the name: only this
    /// repository's test and microbenchmark assemblies have one, never an application's name (the sample's was
    /// "TechEmpower").
    /// </summary>
    [Fact]
    public void Internals_are_visible_only_to_the_repository_s_test_assemblies()
    {
        var grants = typeof(LinuxTransportOptions).Assembly.GetCustomAttributes<System.Runtime.CompilerServices.InternalsVisibleToAttribute>()
            .Select(static a => a.AssemblyName)
            .Order(StringComparer.Ordinal);
        Assert.Equal(
            ["Kestrel.Transport.Linux.Microbenchmarks", "Kestrel.Transport.Linux.Reliability.Tests", "Kestrel.Transport.Linux.Tests"],
            grants);
    }

    [Fact]
    public void Extensions_live_in_the_hosting_namespace_like_UseSockets()
    {
        Assert.Equal("Microsoft.AspNetCore.Hosting", typeof(WebHostBuilderLinuxTransportExtensions).Namespace);
    }

    private static HashSet<string> ReadDeclared()
    {
        var directory = new DirectoryInfo(AppContext.BaseDirectory);
        while (directory is not null && !File.Exists(Path.Combine(directory.FullName, "Kestrel.Transport.Linux.slnx")))
        {
            directory = directory.Parent;
        }

        Assert.NotNull(directory);
        var source = Path.Combine(directory.FullName, "src", "Transport.Linux");
        return File.ReadAllLines(Path.Combine(source, "PublicAPI.Shipped.txt"))
            .Concat(File.ReadAllLines(Path.Combine(source, "PublicAPI.Unshipped.txt")))
            .Select(static line => line.Trim())
            .Where(static line => line.Length > 0 && !line.StartsWith('#'))
            .ToHashSet(StringComparer.Ordinal);
    }

    private static IEnumerable<string> Describe(Assembly assembly)
    {
        foreach (var type in assembly.GetExportedTypes())
        {
            string typeName = Name(type);
            yield return type switch
            {
                { IsEnum: true } => $"{typeName} (enum)",
                { IsInterface: true } => $"{typeName} (interface)",
                { IsAbstract: true, IsSealed: true } => $"static class {typeName}",
                { IsValueType: true } => $"struct {typeName}",
                _ => $"{(type.IsSealed ? "sealed " : string.Empty)}class {typeName}",
            };

            const BindingFlags Declared = BindingFlags.Public | BindingFlags.Instance | BindingFlags.Static | BindingFlags.DeclaredOnly;
            foreach (var member in type.GetMembers(Declared))
            {
                switch (member)
                {
                    case FieldInfo field when type.IsEnum && field.IsStatic:
                        yield return $"{typeName}.{field.Name} = {Convert.ToInt64(field.GetRawConstantValue(), System.Globalization.CultureInfo.InvariantCulture)}";
                        break;
                    case FieldInfo field when !type.IsEnum:
                        yield return $"{(field.IsLiteral ? "const " : field.IsStatic ? "static " : string.Empty)}{typeName}.{field.Name} -> {Name(field.FieldType)}";
                        break;
                    case ConstructorInfo constructor:
                        yield return $"{typeName}.{typeName.Split('.')[^1]}({Parameters(constructor)})";
                        break;
                    case MethodInfo method when !method.IsSpecialName:
                        yield return $"{(method.IsStatic ? "static " : string.Empty)}{typeName}.{method.Name}({Parameters(method)}) -> {Name(method.ReturnType)}";
                        break;
                    case PropertyInfo property:
                        if (property.GetMethod is { IsPublic: true })
                        {
                            yield return $"{typeName}.{property.Name}.get -> {Name(property.PropertyType)}";
                        }

                        if (property.SetMethod is { IsPublic: true })
                        {
                            yield return $"{typeName}.{property.Name}.set -> void";
                        }

                        break;
                }
            }
        }
    }

    private static string Parameters(MethodBase method)
        => string.Join(", ", method.GetParameters().Select(p => $"{(p.ParameterType.IsByRef ? "ref " : string.Empty)}{Name(p.ParameterType)} {p.Name}"));

    private static string Name(Type type)
    {
        if (type == typeof(void))
        {
            return "void";
        }

        if (Nullable.GetUnderlyingType(type) is { } underlying)
        {
            return Name(underlying) + "?";
        }

        if (type.IsByRef)
        {
            return Name(type.GetElementType()!);
        }

        if (type.IsGenericType)
        {
            var name = new StringBuilder(type.GetGenericTypeDefinition().FullName![..type.GetGenericTypeDefinition().FullName!.IndexOf('`', StringComparison.Ordinal)]);
            name.Append('<').AppendJoin(", ", type.GetGenericArguments().Select(Name)).Append('>');
            return name.ToString();
        }

        if (type.IsEnum)
        {
            return type.FullName!;
        }

        return Type.GetTypeCode(type) switch
        {
            TypeCode.Boolean => "bool",
            TypeCode.Int32 => "int",
            TypeCode.Int64 => "long",
            TypeCode.String => "string",
            _ => type.FullName ?? type.Name,
        };
    }
}
